package store

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/internal/testenv"
)

// readQueries parses the statements of file (relative to this package).
func readQueries(tb testing.TB, file string) sqlfile.Queries {
	tb.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		tb.Fatal(err)
	}
	return sqlfile.Parse(file, string(src))
}

// unsentDeadline puts back, in a benchmark's or test's own schema, the index
// schema 45 drops after the rollout (schema 42's reminder_state_expiry
// replaces it), so the statements of schema 41 are measured on the indexes
// they ran on.
func unsentDeadline(tb testing.TB, db *testenv.DB) {
	tb.Helper()
	if _, err := db.Pool.Exec(context.Background(), `CREATE INDEX IF NOT EXISTS reminder_state_unsent_deadline
		ON reminder_state (deadline) WHERE state IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')`); err != nil {
		tb.Fatal(err)
	}
}

// plainState is sql as schema 41's release wrote it: the expiries' test of
// the state without the C collation of schema 42 (ClaimDue's "= 'pending'
// COLLATE "C"", schema 40's, is another spelling and stays).
func plainState(sql string) string { return strings.ReplaceAll(sql, `state COLLATE "C"`, "state") }

// BenchmarkQuietSpellPlans is the survey behind "The claim's plan after a
// quiet spell" and "The quiet spell beyond the claim" (docs/benchmarks.md):
// the statements that read reminder_state by a partial index, on
// TestClaimPlanAfterAQuietSpell's tables (20,000 delivered, analyzed with
// none open) after 10,000 rows entered the state each statement looks for,
// run once with the quiet spell's statistics and once after ANALYZE, each
// under EXPLAIN (ANALYZE, BUFFERS) in a transaction rolled back. Each runs
// as schema 41 had it ("41": its statement, reminder_state_unsent_deadline
// in place) and as after schema 45's rollout ("45": this tree's statement,
// reminder_state_expiry, no unsent_deadline), each in a schema of its own,
// A/B interleaved (the order swapped every other round). A statement whose
// plan changes and costs more with the stale statistics has the hazard. It
// reports each run (execution ms, the backend's CPU ms from /proc
// schedstat, shared buffers, rows read from the partial indexes, the
// indexes) and, over the rounds, the median and range.
//
//	go test ./internal/store -run '^$' -bench QuietSpellPlans -benchtime 1x -v
//	# env: NUDGE_BENCH_ROUNDS (default 1)
func BenchmarkQuietSpellPlans(b *testing.B) {
	if testing.Short() {
		b.Skip("needs PostgreSQL")
	}
	rounds := 1
	if v := os.Getenv("NUDGE_BENCH_ROUNDS"); v != "" {
		if _, err := fmt.Sscan(v, &rounds); err != nil {
			b.Fatal(err)
		}
	}
	dispatchQ, metricsQ, opsQ := readQueries(b, "../dispatch/queries.sql"), readQueries(b, "../metrics/queries.sql"),
		readQueries(b, "../ops/queries.sql")
	// The burst's rows, moved into the state each statement looks for.
	const (
		pending      = ``
		pastDeadline = `UPDATE reminder_state SET deadline = @now::timestamptz - interval '1 second' WHERE state = 'pending'`
		overdue      = `UPDATE reminder_state SET state = 'enqueued', fence = fence + 1,
			enqueued_at = @now::timestamptz - interval '10 minutes' WHERE state = 'pending'`
		leaseExpired = `UPDATE reminder_state SET state = 'enqueued', fence = fence + 1, enqueued_at = @now::timestamptz,
			lease_until = @now::timestamptz - interval '1 second' WHERE state = 'pending'`
	)
	cases := []struct {
		name, setup, sql string
	}{
		{"ClaimDue", pending, query("ClaimDue")},
		{"ResolveExpiredLeases", leaseExpired, query("ResolveExpiredLeases")},
		{"Reclaim", overdue, query("Reclaim")},
		{"metrics DBGauges, pending", pending, metricsQ.Get("DBGauges")},
		{"metrics DBGauges, enqueued", leaseExpired, metricsQ.Get("DBGauges")},
		{"ops StatsAges, pending", pending, opsQ.Get("StatsAges")},
		{"ops StatsAges, enqueued", leaseExpired, opsQ.Get("StatsAges")},
		{"ops Minutes, enqueued", leaseExpired, opsQ.Get("Minutes")},
		{"ops StatsLastClaim, enq.", leaseExpired, opsQ.Get("StatsLastClaim")},
		{"dispatch ExpireDue", pastDeadline, dispatchQ.Get("ExpireDue")},
		{"ExpireOverdue", pastDeadline, query("ExpireOverdue")},
		{"UnknownAtDeadline", pastDeadline, query("UnknownAtDeadline")},
	}
	ctx := context.Background()
	type run struct{ ms, cpu, buffers, rows []float64 }
	results := map[string]*run{}
	indexesOf := map[string]string{}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%-28s %-3s %-6s %8s %8s %8s %8s  %s\n", "statement", "at", "stats", "ms", "cpu ms", "buffers",
		"ix rows", "indexes")
	for range b.N {
		db41, db45 := testenv.Postgres(b), testenv.Postgres(b)
		unsentDeadline(b, db41)
		variants := []struct {
			name string
			db   *testenv.DB
			sql  func(string) string
		}{{"41", db41, plainState}, {"45", db45, func(s string) string { return s }}}
		for round := range rounds {
			for _, c := range cases {
				order := slices.Clone(variants)
				if round%2 == 1 {
					slices.Reverse(order)
				}
				for _, v := range order {
					now := time.Now()
					quietSpell(b, v.db, 20000, 10000, now)
					args := quietArgs(now)
					if c.setup != "" {
						if _, err := v.db.Pool.Exec(ctx, c.setup, args); err != nil {
							b.Fatalf("%s: %v", c.name, err)
						}
					}
					conn, pid := backend(b, v.db)
					for _, stats := range []string{"quiet", "fresh"} {
						if stats == "fresh" {
							if _, err := conn.Exec(ctx, `ANALYZE reminder_state`); err != nil {
								b.Fatal(err)
							}
						}
						tx, err := conn.Begin(ctx)
						if err != nil {
							b.Fatal(err)
						}
						cpu0 := onCPU(pid)
						out := explainJSON(b, tx, "ANALYZE, BUFFERS", v.sql(c.sql), args)
						cpu := float64(onCPU(pid)-cpu0) / 1e6
						if err := tx.Rollback(ctx); err != nil {
							b.Fatal(err)
						}
						used := map[string]int{}
						indexes(out.Plan, used)
						var names []string
						for _, k := range slices.Sorted(maps.Keys(used)) {
							if name, ok := strings.CutPrefix(k, "reminder_state_"); ok && name != "pkey" {
								names = append(names, fmt.Sprintf("%s×%d", name, used[k]))
							}
						}
						buffers, rows := float64(out.Plan.Hit+out.Plan.Read), fromPartialIndexes(out.Plan)
						fmt.Fprintf(&sb, "%-28s %-3s %-6s %8.1f %8.1f %8.0f %8.0f  %s\n", c.name, v.name, stats, out.Exec, cpu,
							buffers, rows, strings.Join(names, " "))
						key := fmt.Sprintf("%-28s %-3s %-6s", c.name, v.name, stats)
						r := results[key]
						if r == nil {
							r = &run{}
							results[key] = r
						}
						r.ms, r.cpu = append(r.ms, out.Exec), append(r.cpu, cpu)
						r.buffers, r.rows = append(r.buffers, buffers), append(r.rows, rows)
						indexesOf[key] = strings.Join(names, " ")
					}
					conn.Release()
				}
			}
		}
	}
	fmt.Fprintf(&sb, "\nmedian (min–max) over %d round(s)\n", rounds*b.N)
	for _, c := range cases {
		for _, at := range []string{"41", "45"} {
			for _, stats := range []string{"quiet", "fresh"} {
				key := fmt.Sprintf("%-28s %-3s %-6s", c.name, at, stats)
				r := results[key]
				mr := func(xs []float64) string {
					return fmt.Sprintf("%.1f (%.1f–%.1f)", median(xs), slices.Min(xs), slices.Max(xs))
				}
				fmt.Fprintf(&sb, "%s ms %-20s cpu ms %-20s buffers %-8.0f ix rows %-7.0f %s\n", key, mr(r.ms), mr(r.cpu),
					median(r.buffers), median(r.rows), indexesOf[key])
			}
		}
	}
	b.Log(sb.String())
}
