package ops

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
)

// planNode is the part of an EXPLAIN (FORMAT JSON) node a plan test reads.
type planNode struct {
	Index string     `json:"Index Name"`
	Cond  string     `json:"Index Cond"`
	Plans []planNode `json:"Plans"`
}

// indexConds lists the index conditions of a plan by index.
func indexConds(n planNode, into map[string][]string) {
	if n.Index != "" {
		into[n.Index] = append(into[n.Index], n.Cond)
	}
	for _, p := range n.Plans {
		indexConds(p, into)
	}
}

// A replay of one tenant's failed and quarantined reminders finds them in
// the replayable index by tenant (schema 36: reminder_state_replayable_tenant,
// the tenant its second column), not by reading the row of every tenant's
// failed reminder to drop the others' (reminder_state_replayable, which had
// no tenant, from schema 32 until 36). The table must be large enough, and
// analyzed, for the planner to weigh the two.
func TestReplayByTenantFindsTheTenantsCandidatesInTheIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	now := time.Now()
	// 20,000 reminders of 16 tenants, one in ten failed or quarantined, in
	// id order across the table (as failures come, over time).
	_, err := db.Pool.Exec(ctx, `WITH ins AS (
		INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key)
		SELECT 'tenant-' || i % 16, 'plan:' || i, 'email', 'u' || i || '@example.com', 'course-expiry', '{}',
		       $1::timestamptz - interval '1 day', $1::timestamptz + interval '1 day', 'plan-' || i
		  FROM generate_series(1, 20000) i
		RETURNING id, tenant, channel, due_at, deadline)
		INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, state)
		SELECT id, tenant, channel, due_at, deadline,
		       CASE WHEN id % 10 = 3 THEN 'failed' WHEN id % 20 = 7 THEN 'quarantined' ELSE 'delivered' END
		  FROM ins
		    ON CONFLICT (id) DO UPDATE SET state = excluded.state`, now)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ANALYZE reminders, reminder_state`)
	require.NoError(t, err)

	var raw []byte
	require.NoError(t, db.Pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+query("Replay"), pgx.NamedArgs{
		"now": now, "min_deadline": now.Add(time.Hour), "ids": []int64{}, "due_from": nil, "due_to": nil,
		"channel": "", "tenant": "tenant-5", "states": []string{"failed", "quarantined"},
		"stuck_before": now.Add(-10 * time.Minute), "limit": 500, "reset_attempts": false, "apply": false,
		"actor": "test", "reason": "plan", "after": int64(0),
	}).Scan(&raw))
	var out []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &out))
	got := map[string][]string{}
	indexConds(out[0].Plan, got)
	conds, ok := got["reminder_state_replayable_tenant"]
	require.True(t, ok, "the replay reads %v", got)
	require.True(t, strings.Contains(strings.Join(conds, " "), "tenant"),
		"the tenant is an index condition, not a filter on each row: %v", got)
}
