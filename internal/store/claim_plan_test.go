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
// reminder_state_claim (in due order; reminder_state_pending_tenant before
// schema version 40, reminders_pending_tenant before 32), not an index that merely covers pending rows
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
	require.NotZero(t, claim["reminder_state_claim"], "%v", claim)
	require.Zero(t, claim["reminders_waiting_keys"], "%v", claim)
	require.Zero(t, claim["reminders_logical_key"], "%v", claim)
	for index := range claim {
		require.False(t, strings.HasPrefix(index, "reminders_"), "the claim reads the wide row's %s: %v", index, claim)
	}
}

// quietSpell fills db as an install that went quiet and then took a burst:
// delivered reminders went through (each pending, then delivered, their
// pending entries left dead in the pending indexes until a vacuum), the
// table was analyzed while none was pending, and then burst reminders due a
// minute before now arrived, before any autoanalyze (autovacuum is off on
// both tables, so the statistics stay as the quiet spell left them). With
// delivered 0 it is a fresh backlog, analyzed after its intake instead: the
// statistics then know the pending rows.
func quietSpell(tb testing.TB, db *testenv.DB, delivered, burst int, now time.Time) {
	tb.Helper()
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		tb.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			tb.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`TRUNCATE reminders, reminder_state CASCADE`)
	exec(`ALTER TABLE reminders SET (autovacuum_enabled = false)`)
	exec(`ALTER TABLE reminder_state SET (autovacuum_enabled = false)`)
	intake := func(from, to int, due time.Time) {
		tb.Helper()
		exec(`INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key)
			SELECT 'tenant-' || i % 4, 'quiet:' || i, 'sms', '+1415' || lpad(i::text, 7, '0'), 'course-expiry', '{}',
			       $3::timestamptz, $3::timestamptz + interval '1 hour', 'quiet-' || i
			  FROM generate_series($1::int, $2::int) i`, from, to, due)
		exec(`INSERT INTO reminder_state (id, tenant, channel, due_at, deadline)
			SELECT r.id, r.tenant, r.channel, r.due_at, r.deadline FROM reminders r
			 WHERE NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)`)
	}
	if delivered > 0 {
		intake(1, delivered, now.Add(-time.Hour))
		exec(`UPDATE reminder_state SET state = 'delivered', fence = fence + 1, finished_at = $1, updated_at = $1`,
			now.Add(-50*time.Minute))
		exec(`ANALYZE reminder_state`)
		exec(`ANALYZE reminders`)
	}
	intake(delivered+1, delivered+burst, now.Add(-time.Minute))
	if delivered == 0 {
		exec(`ANALYZE reminder_state`)
		exec(`ANALYZE reminders`)
	}
}

// claimArgs are ClaimDue's arguments for a claim of 500 at now.
func claimArgs(now time.Time) pgx.NamedArgs {
	return pgx.NamedArgs{"now": now, "cutoff": now, "limit": 500, "lease_until": now.Add(time.Minute), "actor": "d"}
}

// rowQuerier is a pool or one of its connections.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// explainClaimSQL runs sql (a ClaimDue) under EXPLAIN (ANALYZE, BUFFERS):
// it executes and commits. It returns the plan's top node, whose rows are
// the rows claimed and whose buffers count the whole statement's.
func explainClaimSQL(tb testing.TB, db rowQuerier, sql string, now time.Time) explained {
	tb.Helper()
	return explainJSON(tb, db, "ANALYZE, BUFFERS", sql, claimArgs(now))
}

// explainJSON runs sql on db under EXPLAIN with opts (and FORMAT JSON) and
// returns the plan.
func explainJSON(tb testing.TB, db rowQuerier, opts, sql string, args pgx.NamedArgs) explained {
	tb.Helper()
	if opts != "" {
		opts += ", "
	}
	var raw []byte
	if err := db.QueryRow(context.Background(), "EXPLAIN ("+opts+"FORMAT JSON) "+sql, args).Scan(&raw); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	var out []explained
	if err := json.Unmarshal(raw, &out); err != nil {
		tb.Fatal(err)
	}
	return out[0]
}

// fromPartialIndexes is how many rows the plan's scans of reminder_state's
// partial indexes (every index but its primary key) returned, over all
// their loops: index scans, and bitmap index scans (which name no relation:
// their index's name does).
func fromPartialIndexes(n planNode) float64 {
	rows := 0.0
	ours := n.Relation == "reminder_state" || n.Relation == "" && strings.HasPrefix(n.Index, "reminder_state_")
	if ours && n.Index != "" && n.Index != "reminder_state_pkey" {
		rows = n.Rows * n.Loops
	}
	for _, p := range n.Plans {
		rows += fromPartialIndexes(p)
	}
	return rows
}

// An install that went quiet: every reminder delivered, the table analyzed
// while none was pending (the statistics then say no row is), and a burst of
// 10,000 due reminders inserted before the next autoanalyze. The planner
// then estimates every partial index holding pending rows at no rows, and
// until schema 40 took the smallest, reminder_state_unsent_deadline,
// scanned it whole for each tenant's probes and picks, and sorted (4x
// slower at 10,000 rows; docs/benchmarks.md, "The claim's plan after a
// quiet spell"). Whatever the statistics say, the claim's probes and picks
// read reminder_state_claim in due order and no other partial index of the
// state row, and the first claim of 500 reads a bounded number of buffers
// per row it claims.
func TestClaimPlanAfterAQuietSpell(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	now := time.Now()
	quietSpell(t, db, 20000, 10000, now)

	claim := map[string]int{}
	indexes(explainJSON(t, db.Pool, "", query("ClaimDue"), claimArgs(now)).Plan, claim)
	require.Equal(t, 3, claim["reminder_state_claim"], "the tenants' skip scan, their earliest rows, their picks: %v", claim)
	for index := range claim {
		require.Contains(t, []string{"reminder_state_claim", "reminder_state_pkey", "nudge_send_windows_pkey"}, index,
			"the claim reads %s: %v", index, claim)
	}

	// Run: 500 claimed, each read once from the claim's index (and the
	// tenants' probes, a row each). Schema 39's plan read all 10,000
	// pending rows out of unsent_deadline for every probe and for each
	// tenant's picks, and sorted them: 90 rows per row claimed.
	plan := explainClaimSQL(t, db.Pool, query("ClaimDue"), now).Plan
	require.EqualValues(t, 500, plan.Rows)
	t.Logf("per claimed row: %.1f buffers, %.2f rows from the partial indexes", float64(plan.Hit+plan.Read)/500,
		fromPartialIndexes(plan)/500)
	require.LessOrEqual(t, fromPartialIndexes(plan)/500, 1.1, "rows read from the partial indexes per claimed row")
}
