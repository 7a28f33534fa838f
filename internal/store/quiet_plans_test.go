package store

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
)

// quietArgs are the arguments of every statement the quiet-spell plans
// cover, at now: a batch of 500, as the reconciler and the dispatcher run
// them.
func quietArgs(now time.Time) pgx.NamedArgs {
	return pgx.NamedArgs{"now": now, "cutoff": now, "limit": 500, "lease_until": now.Add(time.Minute), "actor": "d",
		"hold_channels": []string{}, "hold_for": "1 hour", "looked": []int64{}, "channels": []string{"sms"},
		"skip": []int64{}, "overdue_before": now.Add(-5 * time.Minute), "waiting": []string{},
		"max_republishes": 5, "hour_ago": now.Add(-time.Hour), "scan": 100000}
}

// explainIn runs sql under EXPLAIN in a transaction it rolls back, with
// ANALYZE and BUFFERS when analyze is set, and returns the plan.
func explainIn(tb testing.TB, db *testenv.DB, sql string, args pgx.NamedArgs, analyze bool) explained {
	tb.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	opts := ""
	if analyze {
		opts = "ANALYZE, BUFFERS"
	}
	return explainJSON(tb, tx, opts, sql, args)
}

// stateIndexes lists the partial indexes of reminder_state a plan reads
// (every index of reminder_state but its primary key), without the
// reminder_state_ prefix, with how many times each appears.
func stateIndexes(n planNode) map[string]int {
	all := map[string]int{}
	indexes(n, all)
	out := map[string]int{}
	for k, v := range all {
		if name, ok := strings.CutPrefix(k, "reminder_state_"); ok && name != "pkey" {
			out[name] += v
		}
	}
	return out
}

// seqScans is how many sequential scans of relation the plan holds.
func seqScans(n planNode, relation string) int {
	count := 0
	if n.NodeType == "Seq Scan" && n.Relation == relation {
		count++
	}
	for _, p := range n.Plans {
		count += seqScans(p, relation)
	}
	return count
}

// An install that went quiet (TestClaimPlanAfterAQuietSpell's quietSpell:
// 20,000 delivered, reminder_state analyzed while no row was open), then a
// burst of 10,000 before the next autoanalyze, spread over the states the
// reconciler and the gauges look for. The statistics say no row is open, so
// every partial index holding open rows is estimated at no rows. Until
// schema 45 dropped it, reminder_state_unsent_deadline (every open row but
// the ones being sent) was a candidate for every statement that tests open
// states, and the smallest: ResolveExpiredLeases read every open row out of
// it and sorted them, Reclaim filtered every open row for its overdue ones,
// and the metrics scrape and nudgectl stats read it for their pending,
// enqueued and parked parts (docs/benchmarks.md, "The quiet spell beyond
// the claim"). Whatever the statistics say, each statement now reads the
// partial indexes of its own states, and the expiries and the oldest open
// deadline read reminder_state_expiry, the only index their C-collated test
// can read and one no other statement's can.
func TestPlansAfterAQuietSpell(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	now := time.Now()
	quietSpell(t, db, 20000, 10000, now)
	// The burst, by id: due and pending; enqueued, confirmed and overdue
	// (Reclaim's); enqueued, its dispatch lease run out (ResolveExpiredLeases');
	// pending past its deadline (the expiries'). No ANALYZE.
	_, err := db.Pool.Exec(ctx, `UPDATE reminder_state
		   SET state = CASE WHEN id % 4 IN (1, 2) THEN 'enqueued' ELSE 'pending' END,
		       fence = fence + 1,
		       enqueued_at = CASE id % 4 WHEN 1 THEN $1::timestamptz - interval '10 minutes'
		                                 WHEN 2 THEN $1::timestamptz END,
		       lease_until = CASE WHEN id % 4 = 2 THEN $1::timestamptz - interval '1 second' END,
		       deadline = CASE WHEN id % 4 = 3 THEN $1::timestamptz - interval '1 second' ELSE deadline END
		 WHERE state = 'pending'`, now)
	require.NoError(t, err)
	args := quietArgs(now)
	metricsQ, opsQ, dispatchQ := readQueries(t, "../metrics/queries.sql"), readQueries(t, "../ops/queries.sql"),
		readQueries(t, "../dispatch/queries.sql")

	// only fails unless the plan's partial indexes of reminder_state are
	// among allowed, and returns them.
	only := func(name, sql string, allowed ...string) map[string]int {
		t.Helper()
		got := stateIndexes(explainIn(t, db, sql, args, false).Plan)
		for index := range got {
			require.Contains(t, allowed, index, "%s reads reminder_state_%s: %v", name, index, got)
		}
		return got
	}

	// The reconciler's pass. ResolveExpiredLeases reads the run-out leases
	// in lease order, a batch's worth; schema 41's plan read all 7,500
	// open rows out of unsent_deadline and sorted them.
	got := only("ResolveExpiredLeases", query("ResolveExpiredLeases"), "leases")
	require.Equal(t, 1, got["leases"], "%v", got)
	plan := explainIn(t, db, query("ResolveExpiredLeases"), args, true).Plan
	require.LessOrEqual(t, fromPartialIndexes(plan), 1.1*500, "rows read from the partial indexes for a batch of 500")
	// Reclaim reads the overdue enqueued rows (2,500) from the enqueued
	// index, the retrying ones from theirs and the sending ones among the
	// leases run out (2,500, all of them dispatch leases here); schema 41's
	// read every open row not past its deadline (7,500) from
	// unsent_deadline instead of the enqueued index.
	got = only("Reclaim", query("Reclaim"), "enqueued", "retrying", "parked", "leases")
	require.Equal(t, 1, got["enqueued"], "%v", got)
	plan = explainIn(t, db, query("Reclaim"), args, true).Plan
	require.LessOrEqual(t, fromPartialIndexes(plan), 1.1*5000, "rows read from the partial indexes")

	// A metrics scrape and nudgectl stats: each part its own states' index,
	// the oldest open deadline the expiry's.
	open := []string{"pending_due", "enqueued", "retrying", "parked", "leases", "expiry"}
	got = only("metrics DBGauges", metricsQ.Get("DBGauges"), append(open, "expired")...)
	require.Equal(t, 1, got["expiry"], "%v", got)
	got = only("ops StatsAges", opsQ.Get("StatsAges"), open...)
	require.Equal(t, 1, got["expiry"], "%v", got)
	// The console's minutes and nudgectl stats' last claim: every part from
	// its states' index, the sending rows from the leases (they always hold
	// one), never the whole table (a sequential scan of reminder_state read
	// every row ever kept: 0.4–1.2 s at 320,000).
	for name, sql := range map[string]string{"ops Minutes": opsQ.Get("Minutes"), "ops StatsLastClaim": opsQ.Get("StatsLastClaim")} {
		got := only(name, sql, "enqueued", "parked", "leases", "terminal_unpurged", "terminal_purged")
		require.Equal(t, 1, got["leases"], "%s: %v", name, got)
		require.Zero(t, seqScans(explainIn(t, db, sql, args, false).Plan, "reminder_state"), "%s scans reminder_state", name)
	}

	// The expiries read reminder_state_expiry (the sending rows from the
	// leases): a test of the state written plainly can no longer read it.
	for name, sql := range map[string]string{"ExpireOverdue": query("ExpireOverdue"),
		"UnknownAtDeadline": query("UnknownAtDeadline"), "dispatch ExpireDue": dispatchQ.Get("ExpireDue")} {
		got := only(name, sql, "expiry", "leases")
		require.Equal(t, 1, got["expiry"], "%s: %v", name, got)
	}
}
