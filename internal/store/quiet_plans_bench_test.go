package store

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

// BenchmarkQuietSpellPlans is the survey behind "The claim's plan after a
// quiet spell" (docs/benchmarks.md): the other statements that read
// reminder_state by a partial index, on TestClaimPlanAfterAQuietSpell's
// tables (20,000 delivered, analyzed with none open) after 10,000 rows
// entered the state each statement looks for, run once with the quiet
// spell's statistics and once after ANALYZE, each under EXPLAIN (ANALYZE,
// BUFFERS) in a transaction rolled back. A statement whose plan changes
// and costs more with the stale statistics has ClaimDue's hazard.
//
//	go test ./internal/store -run '^$' -bench QuietSpellPlans -benchtime 1x -v
func BenchmarkQuietSpellPlans(b *testing.B) {
	if testing.Short() {
		b.Skip("needs PostgreSQL")
	}
	dispatchQ, metricsQ, opsQ := readQueries(b, "../dispatch/queries.sql"), readQueries(b, "../metrics/queries.sql"),
		readQueries(b, "../ops/queries.sql")
	v39 := readQueries(b, "testdata/claim_v39.sql")
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
		{"ClaimDue (schema 39)", pending, v39.Get("ClaimDue")},
		{"ClaimDue", pending, query("ClaimDue")},
		{"dispatch ExpireDue", pastDeadline, dispatchQ.Get("ExpireDue")},
		{"ExpireOverdue", pastDeadline, query("ExpireOverdue")},
		{"UnknownAtDeadline", pastDeadline, query("UnknownAtDeadline")},
		{"Reclaim", overdue, query("Reclaim")},
		{"ResolveExpiredLeases", leaseExpired, query("ResolveExpiredLeases")},
		{"metrics DBGauges, pending", pending, metricsQ.Get("DBGauges")},
		{"metrics DBGauges, enqueued", leaseExpired, metricsQ.Get("DBGauges")},
		{"ops StatsAges, pending", pending, opsQ.Get("StatsAges")},
	}
	ctx := context.Background()
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%-28s %-6s %9s %9s %7s  %s\n", "statement", "stats", "ms", "buffers", "rows", "indexes")
	for range b.N {
		db := testenv.Postgres(b)
		oldClaimIndex(b, db)
		for _, c := range cases {
			now := time.Now()
			quietSpell(b, db, 20000, 10000, now)
			args := pgx.NamedArgs{"now": now, "cutoff": now, "limit": 500, "lease_until": now.Add(time.Minute), "actor": "d",
				"hold_channels": []string{}, "hold_for": "1 hour", "looked": []int64{}, "channels": []string{"sms"},
				"skip": []int64{}, "overdue_before": now.Add(-5 * time.Minute), "waiting": []string{},
				"max_republishes": 5, "hour_ago": now.Add(-time.Hour)}
			if c.setup != "" {
				if _, err := db.Pool.Exec(ctx, c.setup, args); err != nil {
					b.Fatalf("%s: %v", c.name, err)
				}
			}
			for _, stats := range []string{"quiet", "fresh"} {
				if stats == "fresh" {
					if _, err := db.Pool.Exec(ctx, `ANALYZE reminder_state`); err != nil {
						b.Fatal(err)
					}
				}
				var raw []byte
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				err = tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+c.sql, args).Scan(&raw)
				if rerr := tx.Rollback(ctx); err == nil {
					err = rerr
				}
				if err != nil {
					b.Fatalf("%s: %v", c.name, err)
				}
				var out []explained
				if err := json.Unmarshal(raw, &out); err != nil {
					b.Fatal(err)
				}
				used := map[string]int{}
				indexes(out[0].Plan, used)
				var names []string
				for _, k := range slices.Sorted(maps.Keys(used)) {
					names = append(names, fmt.Sprintf("%s×%d", strings.TrimPrefix(k, "reminder_state_"), used[k]))
				}
				fmt.Fprintf(&sb, "%-28s %-6s %9.1f %9d %7.0f  %s\n", c.name, stats, out[0].Exec,
					out[0].Plan.Hit+out[0].Plan.Read, out[0].Plan.Rows, strings.Join(names, " "))
			}
		}
	}
	b.Log(sb.String())
}
