package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/testenv"
)

// BenchmarkStatementFixedCost measures what the worker's and dispatcher's
// statements cost the backend per execution, apart from their rows: each
// runs NUDGE_BENCH_RUNS times (default 2,000) on one connection with an
// empty batch (no row read or written, so no WAL and no commit flush), as
// the binaries run it (pgx's cached prepared statement, autocommit: generic
// plans after five custom ones), beside `SELECT 1` for the round trip
// itself. What remains per execution is the plan cache's revalidation and
// the executor's start and end: every node, expression and result relation
// (with its indexes) set up and torn down again.
//
//	CI=true go test ./internal/store -run '^$' -bench StatementFixedCost -benchtime 1x -v
func BenchmarkStatementFixedCost(b *testing.B) {
	runs := 2000
	if _, err := fmt.Sscan(envOr("NUDGE_BENCH_RUNS", "2000"), &runs); err != nil {
		b.Fatal(err)
	}
	db := testenv.Postgres(b)
	ctx := context.Background()
	now := time.Now()
	none := []int64{}
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE fixed_cost_probe (n int)`); err != nil {
		b.Fatal(err)
	}
	stmts := []struct {
		name, sql string
		args      pgx.NamedArgs
	}{
		{"SELECT 1", "SELECT 1", nil},
		// A write transaction's own cost: one row into a table without
		// indexes, and its commit (a WAL flush), the smallest a transition
		// can cost beside the statements' empty runs.
		{"INSERT 1 row", "INSERT INTO fixed_cost_probe VALUES (1)", nil},
		{"INSERT 1 row, async", "WITH s AS (SELECT set_config('synchronous_commit', 'off', true)) INSERT INTO fixed_cost_probe SELECT 1 FROM s", nil},
		{"ClaimDue", queries.Get("ClaimDue"), pgx.NamedArgs{"now": now, "cutoff": now, "limit": 500,
			"lease_until": now.Add(time.Minute), "actor": "d"}},
		{"ConfirmPublished", queries.Get("ConfirmPublished"), pgx.NamedArgs{"now": now, "batches": none,
			"confirmed": []int32{}, "actor": "d"}},
		{"ClaimForDelivery", queries.Get("ClaimForDelivery"), pgx.NamedArgs{"now": now, "channel": "sms",
			"ids": none, "fences": none, "lease_until": now.Add(time.Minute), "actor": "w", "provider": ""}},
		{"RecordOutcomes", queries.Get("RecordOutcomes"), func() pgx.NamedArgs {
			a, err := outcomeArgs(now, nil, "w")
			if err != nil {
				b.Fatal(err)
			}
			return a
		}()},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%-18s %8s %14s\n", "statement (empty)", "runs", "CPU µs per run")
	for _, st := range stmts {
		conn, pid := backend(b, db)
		run := func(n int) {
			for range n {
				rows, err := conn.Query(ctx, st.sql, st.args)
				if err != nil {
					b.Fatalf("%s: %v", st.name, err)
				}
				rows.Close()
				if err := rows.Err(); err != nil {
					b.Fatalf("%s: %v", st.name, err)
				}
			}
		}
		run(10) // past the five custom plans
		cpu0 := onCPU(pid)
		run(runs)
		cpu := onCPU(pid) - cpu0
		conn.Release()
		fmt.Fprintf(&sb, "%-18s %8d %14.1f\n", st.name, runs, float64(cpu)/1000/float64(runs))
	}
	b.Log(sb.String())
}
