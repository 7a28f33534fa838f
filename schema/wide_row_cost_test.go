package schema_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// explainer is a pg.Querier that runs a statement under EXPLAIN (ANALYZE,
// WAL) instead and keeps the plan's totals: ScheduleMany then fails on the
// plan's rows, which is expected.
type explainer struct {
	pg.Querier
	walRecords, walBytes float64
}

var errExplained = errors.New("explained")

func (e *explainer) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	var raw []byte
	if err := e.Querier.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		return nil, err
	}
	var out []struct {
		Plan struct {
			WALRecords float64 `json:"WAL Records"`
			WALBytes   float64 `json:"WAL Bytes"`
		}
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, err
	}
	e.walRecords, e.walBytes = out[0].Plan.WALRecords, out[0].Plan.WALBytes
	return nil, errExplained
}

func (e *explainer) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return e.Querier.Exec(ctx, sql, args...)
}

// BenchmarkIntakeWideRow measures intake's writes: one ScheduleMany of
// 1,000 new reminders under EXPLAIN (ANALYZE, WAL) on this tree's schema
// with lazy intake off (as schema 38 leaves it; reminders due in an hour)
// and with it on (horizon 2 hours, reminders due in 3: no state row), in
// pairs A B B A, NUDGE_BENCH_PAIRS pairs (5). It reports the statement's WAL
// records and bytes per row and the wide row's average size (pg_column_size
// of the row). Until schema 38 it compared schema 35 with 37 (the wide row
// without its state columns, docs/benchmarks.md); this tree's intake writes
// reminders.lazy, which a schema before 38 lacks, so that comparison runs
// at 032cd5b. Not a test: the figures are for docs/benchmarks.md.
//
//	CI=true go test -run '^$' -bench IntakeWideRow -benchtime 1x ./schema/
func BenchmarkIntakeWideRow(b *testing.B) {
	ctx := context.Background()
	pairs := 5
	if v := os.Getenv("NUDGE_BENCH_PAIRS"); v != "" {
		_, _ = fmt.Sscan(v, &pairs)
	}
	const n = 1000
	run := func(name string, db *testenv.DB, round int, lazy bool) string {
		due := time.Now().Add(time.Hour)
		if lazy {
			if _, err := db.Pool.Exec(ctx, `UPDATE nudge_lazy_intake SET horizon = interval '2 hours'`); err != nil {
				b.Fatal(err)
			}
			due = time.Now().Add(3 * time.Hour)
		}
		reqs := make([]intake.Request, n)
		for i := range reqs {
			reqs[i] = intake.Request{Tenant: "acme", Key: fmt.Sprintf("wide-%d-%d", round, i), Channel: reminder.Email,
				Recipient: "learner@example.com", Template: "course-expiry", Data: map[string]any{"course": "Go 101"},
				DueAt: due, Deadline: due.Add(24 * time.Hour)}
		}
		e := &explainer{Querier: db.Pool}
		if _, err := intake.ScheduleMany(ctx, e, reqs); !errors.Is(err, errExplained) {
			b.Fatalf("%s: %v", name, err)
		}
		var width float64
		if err := db.Pool.QueryRow(ctx, `SELECT avg(pg_column_size(r.*)) FROM reminders r`).Scan(&width); err != nil {
			b.Fatal(err)
		}
		return fmt.Sprintf("%-10s WAL records/row %.2f  WAL B/row %.0f  wide row B %.0f", name, e.walRecords/n, e.walBytes/n, width)
	}
	for range b.N {
		var lines []string
		for p := range pairs {
			order := []bool{false, true}
			if p%2 == 1 {
				order = []bool{true, false}
			}
			for _, lazy := range order {
				name := "lazy off"
				if lazy {
					name = "lazy on"
				}
				lines = append(lines, run(name, testenv.Postgres(b), p, lazy))
			}
		}
		b.Logf("\n%s", strings.Join(lines, "\n"))
	}
}
