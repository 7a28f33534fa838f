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
	"github.com/nudgehq/nudge/schema"
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

// BenchmarkIntakeWideRowBeforeAndAfter37 measures what dropping reminders'
// stale state columns (schema 37) saves at intake: one ScheduleMany of
// 1,000 new reminders under EXPLAIN (ANALYZE, WAL) on a schema with 35
// applied (release 1 after its rollout) and on one with 37 too, in pairs
// A B B A, NUDGE_BENCH_PAIRS pairs (5). It reports the statement's WAL
// records and bytes per row and the wide row's average size
// (pg_column_size of the row) for each. Not a test: the figures are for
// docs/benchmarks.md.
//
//	CI=true go test -run '^$' -bench IntakeWideRow -benchtime 1x ./schema/
func BenchmarkIntakeWideRowBeforeAndAfter37(b *testing.B) {
	ctx := context.Background()
	pairs := 5
	if v := os.Getenv("NUDGE_BENCH_PAIRS"); v != "" {
		_, _ = fmt.Sscan(v, &pairs)
	}
	const n = 1000
	at35 := func() *testenv.DB {
		db := testenv.PostgresBeforeRollout(b)
		migs, err := schema.Migrations()
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range migs {
			if m.Version == 35 {
				if _, err := db.Pool.Exec(ctx, m.SQL); err != nil {
					b.Fatal(err)
				}
			}
		}
		return db
	}
	run := func(name string, db *testenv.DB, round int) string {
		due := time.Now().Add(time.Hour)
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
			order := []string{"35", "37"}
			if p%2 == 1 {
				order = []string{"37", "35"}
			}
			for _, which := range order {
				var db *testenv.DB
				if which == "35" {
					db = at35()
				} else {
					db = testenv.Postgres(b)
				}
				lines = append(lines, run("schema "+which, db, p))
			}
		}
		b.Logf("\n%s", strings.Join(lines, "\n"))
	}
}
