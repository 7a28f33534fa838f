package store

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/testenv"
)

// BenchmarkClaimPlan drains a backlog of 10,000 due reminders (4 tenants)
// in claims of 500 with schema 39's ClaimDue (testdata/claim_v39.sql) and
// today's, on the same schema, A/B interleaved: each round builds the
// tables afresh for each statement, the order swapped every other round.
// Two tables: "fresh", the backlog analyzed after its intake (the
// statistics know it), and "quiet", TestClaimPlanAfterAQuietSpell's
// (20,000 delivered, analyzed with none pending, then the backlog).
// Every claim runs under EXPLAIN (ANALYZE, BUFFERS) and commits. It
// reports, median and range over the rounds: the first claim's and the
// drain's milliseconds per claim (EXPLAIN's execution time), the backend's
// CPU time per claim (/proc schedstat, less moved by the machine's load
// than wall time), shared buffers per claimed row, and rows read from the
// partial indexes per claimed row.
//
//	go test ./internal/store -run '^$' -bench ClaimPlan -benchtime 1x -v
//	# env: NUDGE_BENCH_ROUNDS (default 3)
func BenchmarkClaimPlan(b *testing.B) {
	if testing.Short() {
		b.Skip("needs PostgreSQL")
	}
	statements := []struct{ name, sql string }{
		{"schema 39", readQueries(b, "testdata/claim_v39.sql").Get("ClaimDue")},
		{"today", query("ClaimDue")},
	}
	rounds := 3
	if v := os.Getenv("NUDGE_BENCH_ROUNDS"); v != "" {
		if _, err := fmt.Sscan(v, &rounds); err != nil {
			b.Fatal(err)
		}
	}
	type result struct{ first, perClaim, cpu, buffers, fromIndexes []float64 }
	results := map[string]*result{}
	for range b.N {
		db := testenv.Postgres(b)
		oldClaimIndex(b, db)
		for round := range rounds {
			for _, table := range []struct {
				name      string
				delivered int
			}{{"fresh", 0}, {"quiet", 20000}} {
				order := slices.Clone(statements)
				if round%2 == 1 {
					slices.Reverse(order)
				}
				for _, st := range order {
					now := time.Now()
					quietSpell(b, db, table.delivered, 10000, now)
					var ms, cpu, buffers, fromIndexes []float64
					claimed := 0.0
					conn, pid := backend(b, db)
					for claimed < 10000 {
						cpu0 := onCPU(pid)
						plan := explainClaimSQL(b, conn, st.sql, now)
						cpu = append(cpu, float64(onCPU(pid)-cpu0)/1e6)
						if plan.Plan.Rows == 0 {
							b.Fatalf("%s on %s: claimed nothing after %.0f", st.name, table.name, claimed)
						}
						claimed += plan.Plan.Rows
						ms = append(ms, plan.Exec)
						buffers = append(buffers, float64(plan.Plan.Hit+plan.Plan.Read))
						fromIndexes = append(fromIndexes, fromPartialIndexes(plan.Plan))
					}
					conn.Release()
					sum := func(xs []float64) (s float64) {
						for _, x := range xs {
							s += x
						}
						return s
					}
					key := table.name + " | " + st.name
					r := results[key]
					if r == nil {
						r = &result{}
						results[key] = r
					}
					r.first = append(r.first, ms[0])
					r.perClaim = append(r.perClaim, sum(ms)/float64(len(ms)))
					r.cpu = append(r.cpu, sum(cpu)/float64(len(cpu)))
					r.buffers = append(r.buffers, sum(buffers)/claimed)
					r.fromIndexes = append(r.fromIndexes, sum(fromIndexes)/claimed)
				}
			}
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nClaimDue, 10,000 due in claims of 500, %d rounds: median (min–max)\n", rounds)
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range results {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range keys {
		r := results[k]
		fmt.Fprintf(&sb, "%-20s first claim %6.1f ms (%.1f–%.1f) | ms per claim %6.1f (%.1f–%.1f) | backend CPU ms per claim %6.1f (%.1f–%.1f)"+
			" | buffers per row %5.1f (%.1f–%.1f) | partial-index rows per row %6.2f\n", k, median(r.first), slices.Min(r.first), slices.Max(r.first),
			median(r.perClaim), slices.Min(r.perClaim), slices.Max(r.perClaim), median(r.cpu), slices.Min(r.cpu), slices.Max(r.cpu),
			median(r.buffers), slices.Min(r.buffers), slices.Max(r.buffers), median(r.fromIndexes))
	}
	b.Log(sb.String())
}

// oldClaimIndex puts back, in a benchmark's own schema, the index schema
// 39's ClaimDue (testdata/claim_v39.sql) was written for and schema 41
// drops after the rollout, so the old statement is measured as it ran.
// Today's ClaimDue cannot use it (its predicate has no COLLATE "C").
func oldClaimIndex(tb testing.TB, db *testenv.DB) {
	tb.Helper()
	if _, err := db.Pool.Exec(context.Background(), `CREATE INDEX IF NOT EXISTS reminder_state_pending_tenant
		ON reminder_state (tenant, due_at, id) WHERE state = 'pending'`); err != nil {
		tb.Fatal(err)
	}
}
