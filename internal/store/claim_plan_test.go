package store

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

// indexes lists the indexes a plan reads, with how many times each appears.
func indexes(n planNode, into map[string]int) {
	if n.Index != "" {
		into[n.Index]++
	}
	for _, p := range n.Plans {
		indexes(p, into)
	}
}

// Just after a bulk intake the table has no statistics, and the planner
// estimates every partial index at a row or so: the claim's per-tenant
// probes of pending rows must still read the first entries of
// reminder_state_pending_tenant (in due order; reminders_pending_tenant
// before schema version 32), not an index that merely covers pending rows
// too (reminders_waiting_keys, schema version 27, which would read every
// pending row of the tenant and sort them). Since version 32 the claim reads
// no index of the wide row at all.
func TestClaimPlanOnATableWithoutStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	now := time.Now()
	// As a bulk intake leaves it (a table of 4,000 rows does not show it).
	_, err := db.Pool.Exec(ctx, `INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline,
		idempotency_key)
		SELECT 'tenant-' || i % 4, 'plan:' || i, 'sms', '+1415' || lpad(i::text, 7, '0'), 'course-expiry', '{}',
		       $1::timestamptz - interval '1 minute', $1::timestamptz + interval '1 hour', 'plan-' || i
		  FROM generate_series(1, 20000) i`, now)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO reminder_state (id, tenant, channel, due_at, deadline)
		SELECT id, tenant, channel, due_at, deadline FROM reminders`)
	require.NoError(t, err)

	plan := func(name string, args pgx.NamedArgs) map[string]int {
		t.Helper()
		var raw []byte
		require.NoError(t, db.Pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+query(name), args).Scan(&raw))
		var out []explained
		require.NoError(t, json.Unmarshal(raw, &out))
		got := map[string]int{}
		indexes(out[0].Plan, got)
		return got
	}
	claim := plan("ClaimDue", pgx.NamedArgs{"now": now, "cutoff": now, "limit": 500,
		"lease_until": now.Add(time.Minute), "actor": "d"})
	require.NotZero(t, claim["reminder_state_pending_tenant"], "%v", claim)
	require.Zero(t, claim["reminders_waiting_keys"], "%v", claim)
	require.Zero(t, claim["reminders_logical_key"], "%v", claim)
	for index := range claim {
		require.False(t, strings.HasPrefix(index, "reminders_"), "the claim reads the wide row's %s: %v", index, claim)
	}
}
