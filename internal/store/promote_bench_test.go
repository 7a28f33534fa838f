package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BenchmarkPromoterPassLazyOff measures what schema 38 adds to every
// dispatcher run while lazy intake is off (as the migration leaves it): one
// promoter pass (Promote: the watermark row locked, pg_locks read, an empty
// scan of the partial reminders_due_order, the row saved), on a table of
// NUDGE_BENCH_SMALL (default 10,000) and one of NUDGE_BENCH_BIG (default
// 1,000,000) reminders, every one with its state row and lazy false
// (BenchmarkDueOrder's "full" build, 100 due). Passes are timed in rounds of
// 200, the tables alternating (small, big, big, small, ...); then one
// Promote statement and one PromoterSave under EXPLAIN (ANALYZE, BUFFERS,
// WAL), rolled back.
//
//	NUDGE_BENCH_BIG=1000000 go test ./internal/store -run '^$' -bench PromoterPassLazyOff -benchtime 1x -v
func BenchmarkPromoterPassLazyOff(b *testing.B) {
	big, small := 1_000_000, 10_000
	for _, v := range []struct {
		env string
		to  *int
	}{{"NUDGE_BENCH_BIG", &big}, {"NUDGE_BENCH_SMALL", &small}} {
		if _, err := fmt.Sscan(envOr(v.env, fmt.Sprint(*v.to)), v.to); err != nil {
			b.Fatalf("%s: %v", v.env, err)
		}
	}
	const rounds, passes = 6, 200
	ctx := context.Background()
	for range b.N {
		now := time.Now().UTC()
		tables := []*dueTable{buildDueTable(b, "full", small, 100, now), buildDueTable(b, "full", big, 100, now)}
		perPass := make([][]float64, len(tables)) // µs of wall time per pass, one per round
		for r := range rounds {
			order := []int{0, 1}
			if r%2 == 1 {
				order = []int{1, 0}
			}
			for _, i := range order {
				st := New(tables[i].db.Pool)
				started := time.Now()
				for range passes {
					p, err := st.Promote(ctx, time.Now().Add(time.Hour), time.Hour, 5000)
					if err != nil {
						b.Fatal(err)
					}
					if p.Read != 0 || !p.SweepDone || !p.Through.IsZero() {
						b.Fatalf("a pass with nothing lazy: %+v", p)
					}
				}
				perPass[i] = append(perPass[i], float64(time.Since(started).Microseconds())/passes)
			}
		}
		for i, t := range tables {
			hit, read, walB := explainPass(b, t, now)
			med := slices.Clone(perPass[i])
			slices.Sort(med)
			b.Logf("%s: pass %.0f µs (median of %d rounds of %d; %.0f–%.0f); Promote's buffers hit %d read %d; "+
				"PromoterSave's WAL %d B", t.name, med[len(med)/2], rounds, passes, med[0], med[len(med)-1], hit, read, walB)
		}
	}
}

// explainPass runs Promote and PromoterSave of a pass with nothing lazy
// under EXPLAIN (ANALYZE, BUFFERS, WAL) in a transaction it rolls back.
func explainPass(tb testing.TB, t *dueTable, now time.Time) (hit, read, walBytes int64) {
	tb.Helper()
	ctx := context.Background()
	type node struct {
		Plan struct {
			Hit      int64 `json:"Shared Hit Blocks"`
			Read     int64 `json:"Shared Read Blocks"`
			WALBytes int64 `json:"WAL Bytes"`
		} `json:"Plan"`
	}
	err := pgx.BeginFunc(ctx, t.db.Pool, func(tx pgx.Tx) error {
		var raw []byte
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) "+query("Promote"), pgx.NamedArgs{
			"after_due": now, "after_id": 0, "until": now.Add(time.Hour), "limit": 5000}).Scan(&raw); err != nil {
			return err
		}
		var n []node
		if err := json.Unmarshal(raw, &n); err != nil {
			return err
		}
		hit, read = n[0].Plan.Hit, n[0].Plan.Read
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) "+query("PromoterSave"), pgx.NamedArgs{
			"ahead": time.Hour, "final_until": now, "prov_until": now.Add(time.Hour), "prov_wait": []string{},
			"floor_wait": []string{}, "floor_at": []time.Time{}, "sweep_until": nil, "sweep_wait": nil, "sweep_prev_done": nil, "cursor_due": nil, "cursor_id": nil}).
			Scan(&raw); err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &n); err != nil {
			return err
		}
		walBytes = n[0].Plan.WALBytes
		return errRollback
	})
	if err != nil && err != errRollback {
		tb.Fatal(err)
	}
	return hit, read, walBytes
}

var errRollback = fmt.Errorf("rolled back")
