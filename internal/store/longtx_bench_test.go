package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// longTxSQL is testdata/longtx.sql's statement called name.
var longTxSQL = testdataSQL("testdata/longtx.sql")

// longTxRun is one dispatcher run of BenchmarkPromoterUnderLongTransaction:
// promoter passes until the sweep completes, then claims until nothing is
// due, then a small intake.
type longTxRun struct {
	passes                  int
	read, promoted          int64
	promoteWall, promoteCPU time.Duration
	hit, readBuf, dirtied   int64 // the sweep's Promote replayed under EXPLAIN (rolled back)
	walRecs, walBytes       int64
	finalAge                float64       // nudge_promoter_final_age_seconds after the run
	scrape                  time.Duration // the collector's scrape that read it
	claimed                 int
	claims                  int
	claimWall, claimCPU     time.Duration
	intakeWall              time.Duration
}

// BenchmarkPromoterUnderLongTransaction measures what a web transaction that
// wrote a lazy reminder and stays open costs the dispatcher (the promoter's
// claim: "a long transaction costs re-scans of the provisional range, never
// a loss, never a blocked intake or claim"; docs/benchmarks.md, "A
// due-ordered store for the spread claim").
//
// The table: NUDGE_BENCH_BIG (default 100,000) lazy reminders due uniformly
// over [now − max(3h, the oldest age), now + NUDGE_BENCH_DAYS days)
// (default 2), those due before now delivered (their state rows as the
// promoter, claim and workers left them), plus a trickle of NUDGE_BENCH_TRICKLE (default 50) lazy
// reminders a second due over the next 20 minutes; everything due before
// now + H promoted, final at now + H, reminders vacuumed. Then dispatcher
// runs back to back, NUDGE_BENCH_K (default 5) in each phase, with the
// dispatcher's defaults (H 1h, promoter passes of 5,000, claims of 500, the
// until of now + H bounded by the database's clock): each run is promoter
// passes until the sweep completes, claims of what is due until none is,
// and an intake of 100 lazy reminders (ScheduleMany, its own transaction).
// Phases: "steady" (no long transaction); "open" (a web transaction has
// scheduled one lazy reminder through ScheduleMany and stays open), then
// the same transaction at emulated ages NUDGE_BENCH_AGES (default
// 1h,3h,6h: final and the writers' floors moved back by the age, as that
// long with it open would have left them: LongTxAge); "after" (committed). Per run: the promoter's wall and
// backend CPU (/proc/PID/schedstat of the store's one connection), rows
// read and promoted, the sweep's Promote statement replayed under EXPLAIN
// (ANALYZE, BUFFERS, WAL) from the same start to the same until (rolled
// back: a re-scan's buffers), nudge_promoter_final_age_seconds and the wall
// time of the scrape that read it (metrics.DBCollector), and the claim's rows, wall and backend CPU.
//
//	NUDGE_BENCH_BIG=1000000 CI=true go test ./internal/store -run '^$' -bench PromoterUnderLongTransaction -benchtime 1x -v
func BenchmarkPromoterUnderLongTransaction(b *testing.B) {
	big, days, trickle, k := 100_000, 2, 50, 5
	for _, v := range []struct {
		env string
		to  *int
	}{{"NUDGE_BENCH_BIG", &big}, {"NUDGE_BENCH_DAYS", &days}, {"NUDGE_BENCH_TRICKLE", &trickle}, {"NUDGE_BENCH_K", &k}} {
		if _, err := fmt.Sscan(envOr(v.env, fmt.Sprint(*v.to)), v.to); err != nil {
			b.Fatalf("%s: %v", v.env, err)
		}
	}
	var ages []time.Duration
	for _, s := range strings.Split(envOr("NUDGE_BENCH_AGES", "1h,3h,6h"), ",") {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("NUDGE_BENCH_AGES: %v", err)
		}
		ages = append(ages, d)
	}
	back := max(3*time.Hour, slices.Max(ages)) // the fill's history: every emulated range lies in it
	const (
		ahead, passBatch, claimBatch = time.Hour, 5000, 500
		window                       = 20 * time.Minute
	)
	ctx := context.Background()
	for range b.N {
		db := testenv.Postgres(b)
		setLazyIntake(b, db, durationPtr(2*time.Hour))
		started := time.Now()
		now := dbNow(b, db)
		fills := []pgx.NamedArgs{}
		const chunk = 250_000
		for first := 1; first <= big; first += chunk {
			fills = append(fills, pgx.NamedArgs{"first": first, "last": min(first+chunk-1, big), "prefix": "lazy:",
				"from": now.Add(-back), "to": now.Add(time.Duration(days) * 24 * time.Hour)})
		}
		fills = append(fills, pgx.NamedArgs{"first": 1, "last": trickle * int(window/time.Second), "prefix": "trickle:",
			"from": now, "to": now.Add(window)})
		var jobs []func(*pgxpool.Conn) error
		for _, args := range fills {
			jobs = append(jobs, func(c *pgxpool.Conn) error {
				_, err := c.Exec(ctx, longTxSQL("LongTxFill"), args)
				return err
			})
		}
		runParallel(b, db.Pool, jobs)
		for _, q := range []struct {
			sql  string
			args pgx.NamedArgs
		}{
			{longTxSQL("LongTxDelivered"), pgx.NamedArgs{"now": now}},
			{longTxSQL("LongTxWatermark"), pgx.NamedArgs{"final": now}},
		} {
			if _, err := db.Pool.Exec(ctx, q.sql, q.args); err != nil {
				b.Fatal(err)
			}
		}
		// The store on one connection, so its backend's CPU is the passes'.
		pool, err := pgxpool.New(ctx, db.URL+"&pool_max_conns=1")
		if err != nil {
			b.Fatal(err)
		}
		defer pool.Close()
		st := New(pool)
		var pid int
		if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			b.Fatal(err)
		}
		// Two sweeps: the first promotes [now, now + H), the second moves
		// final there, as a running dispatcher leaves it.
		for sweeps := 0; sweeps < 2; {
			p, err := st.Promote(ctx, time.Now().Add(ahead), ahead, passBatch)
			if err != nil {
				b.Fatal(err)
			}
			if p.SweepDone {
				sweeps++
			}
		}
		for _, q := range []string{`VACUUM ANALYZE reminders`, `ANALYZE reminder_state`} {
			if _, err := db.Pool.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(metrics.NewDBCollector(db.Pool, clock.Real{}))
		b.Logf("built %d + %d lazy reminders in %s", big, trickle*int(window/time.Second), time.Since(started).Round(time.Second))

		intakes := 0
		run := func() longTxRun {
			var r longTxRun
			var from, until time.Time
			cpu0, t0 := onCPU(pid), time.Now()
			for {
				p, err := st.Promote(ctx, time.Now().Add(ahead), ahead, passBatch)
				if err != nil {
					b.Fatal(err)
				}
				if r.passes == 0 {
					from = p.From // the sweep's start: final, a gone writer's floor, or the last end
				}
				r.passes++
				r.read += int64(p.Read)
				r.promoted += p.Promoted
				if p.SweepDone {
					break
				}
			}
			r.promoteWall, r.promoteCPU = time.Since(t0), time.Duration(onCPU(pid)-cpu0)
			if err := db.Pool.QueryRow(ctx, `SELECT prov_until FROM nudge_promoter`).Scan(&until); err != nil {
				b.Fatal(err)
			}
			r.hit, r.readBuf, r.dirtied, r.walRecs, r.walBytes = explainSweep(b, db, from, until, int(r.read)+1)
			t0 = time.Now()
			r.finalAge = gaugeValue(b, reg, "nudge_promoter_final_age_seconds")
			r.scrape = time.Since(t0)
			cpu0, t0 = onCPU(pid), time.Now()
			for {
				now := time.Now()
				claimed, more, err := st.ClaimDueBatch(ctx, now, now, claimBatch, 2*time.Minute, "bench")
				if err != nil {
					b.Fatal(err)
				}
				r.claims++
				r.claimed += len(claimed)
				if !more || len(claimed) == 0 {
					break
				}
			}
			r.claimWall, r.claimCPU = time.Since(t0), time.Duration(onCPU(pid)-cpu0)
			t0 = time.Now()
			scheduleLazy(b, db.Pool, fmt.Sprintf("intake:%d:", intakes), 100, time.Duration(days)*24*time.Hour)
			intakes++
			r.intakeWall = time.Since(t0)
			return r
		}
		type phase struct {
			name string
			runs []longTxRun
		}
		var phases []phase
		runs := func(name string, n int) {
			ph := phase{name: name}
			for range n {
				ph.runs = append(ph.runs, run())
			}
			phases = append(phases, ph)
		}
		runs("steady", k)
		web, err := db.Pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer web.Rollback(ctx) //nolint:errcheck
		scheduleLazy(b, web, "web:", 1, time.Duration(days)*24*time.Hour)
		var f0 time.Time // final when the transaction began
		if err := db.Pool.QueryRow(ctx, `SELECT final_until FROM nudge_promoter`).Scan(&f0); err != nil {
			b.Fatal(err)
		}
		runs("open, age 0", k)
		for _, age := range ages {
			if _, err := db.Pool.Exec(ctx, longTxSQL("LongTxAge"), pgx.NamedArgs{"final": f0, "age": age}); err != nil {
				b.Fatal(err)
			}
			runs("open, age "+age.String(), k)
		}
		if err := web.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		runs("after commit", k)
		var lost int
		if err := db.Pool.QueryRow(ctx, dueOrderSQL("LostBelowWatermark")).Scan(&lost); err != nil {
			b.Fatal(err)
		}
		var sb strings.Builder
		fmt.Fprintf(&sb, "%d lazy reminders over %d days + a trickle of %d/s; K = %d runs a phase; after: lost below final %d\n",
			big, days, trickle, k, lost)
		fmt.Fprintf(&sb, "%-16s %3s %7s %7s %6s %9s %9s %8s %7s %7s %6s %9s %7s %6s %8s %9s %8s\n", "phase", "run", "read", "promo",
			"passes", "wall ms", "cpu ms", "hit", "readB", "dirty", "walR", "final age", "scrape", "claim", "claim ms", "claim cpu", "intake")
		for _, ph := range phases {
			for i, r := range ph.runs {
				fmt.Fprintf(&sb, "%-16s %3d %7d %7d %6d %9.1f %9.1f %8d %7d %7d %6d %9.0f %7.1f %6d %8.1f %9.1f %8.1f\n", ph.name, i+1,
					r.read, r.promoted, r.passes, ms(r.promoteWall), ms(r.promoteCPU), r.hit, r.readBuf, r.dirtied, r.walRecs,
					r.finalAge, ms(r.scrape), r.claimed, ms(r.claimWall), ms(r.claimCPU), ms(r.intakeWall))
			}
			med := func(f func(longTxRun) float64) float64 {
				var xs []float64
				for _, r := range ph.runs {
					xs = append(xs, f(r))
				}
				slices.Sort(xs)
				return xs[len(xs)/2]
			}
			fmt.Fprintf(&sb, "%-16s med %7.0f %7.0f %6.0f %9.1f %9.1f %8.0f %7.0f %7.0f %6.0f %9.0f %7.1f %6.0f %8.1f %9.1f %8.1f; promoter CPU µs/row read %.2f, claim CPU µs/row %.1f\n",
				ph.name, med(func(r longTxRun) float64 { return float64(r.read) }),
				med(func(r longTxRun) float64 { return float64(r.promoted) }),
				med(func(r longTxRun) float64 { return float64(r.passes) }),
				med(func(r longTxRun) float64 { return ms(r.promoteWall) }),
				med(func(r longTxRun) float64 { return ms(r.promoteCPU) }),
				med(func(r longTxRun) float64 { return float64(r.hit) }),
				med(func(r longTxRun) float64 { return float64(r.readBuf) }),
				med(func(r longTxRun) float64 { return float64(r.dirtied) }),
				med(func(r longTxRun) float64 { return float64(r.walRecs) }),
				med(func(r longTxRun) float64 { return r.finalAge }),
				med(func(r longTxRun) float64 { return ms(r.scrape) }),
				med(func(r longTxRun) float64 { return float64(r.claimed) }),
				med(func(r longTxRun) float64 { return ms(r.claimWall) }),
				med(func(r longTxRun) float64 { return ms(r.claimCPU) }),
				med(func(r longTxRun) float64 { return ms(r.intakeWall) }),
				med(func(r longTxRun) float64 { return float64(r.promoteCPU.Microseconds()) / max(float64(r.read), 1) }),
				med(func(r longTxRun) float64 { return float64(r.claimCPU.Microseconds()) / max(float64(r.claimed), 1) }))
		}
		b.Log("\n" + sb.String())
		if lost != 0 {
			b.Fatalf("after the commit: %d committed reminders below final without a state row", lost)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// dbNow is the database's clock.
func dbNow(tb testing.TB, db *testenv.DB) time.Time {
	tb.Helper()
	var now time.Time
	if err := db.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now); err != nil {
		tb.Fatal(err)
	}
	return now
}

// scheduleLazy schedules n SMS reminders keyed prefix+i through ScheduleMany,
// due 3h to 3h+spread ahead (lazy with a 2-hour horizon).
func scheduleLazy(tb testing.TB, q intake.Querier, prefix string, n int, spread time.Duration) {
	tb.Helper()
	now := time.Now()
	reqs := make([]intake.Request, n)
	for i := range reqs {
		due := now.Add(3*time.Hour + spread*time.Duration(i)/time.Duration(n))
		reqs[i] = intake.Request{Tenant: fmt.Sprintf("tenant-%d", i%16), Key: fmt.Sprintf("%s%d", prefix, i),
			Channel: reminder.SMS, Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
			Data: map[string]any{"course": "Go 101"}, DueAt: due, Deadline: due.Add(24 * time.Hour)}
	}
	if _, err := intake.ScheduleMany(context.Background(), q, reqs); err != nil {
		tb.Fatal(err)
	}
}

// explainSweep replays a sweep's Promote, [from, until) up to limit rows,
// under EXPLAIN (ANALYZE, BUFFERS, WAL) in a transaction rolled back: the
// buffers a re-scan of the range reads and the WAL it writes.
func explainSweep(tb testing.TB, db *testenv.DB, from, until time.Time, limit int) (hit, read, dirtied, walRecs, walB int64) {
	tb.Helper()
	ctx := context.Background()
	var out []struct {
		Plan struct {
			Hit      int64 `json:"Shared Hit Blocks"`
			Read     int64 `json:"Shared Read Blocks"`
			Dirtied  int64 `json:"Shared Dirtied Blocks"`
			WALRecs  int64 `json:"WAL Records"`
			WALBytes int64 `json:"WAL Bytes"`
		} `json:"Plan"`
	}
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var raw []byte
		if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, WAL, TIMING OFF, FORMAT JSON) "+query("Promote"), pgx.NamedArgs{
			"after_due": from, "after_id": 0, "until": until, "limit": limit}).Scan(&raw); err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &out); err != nil {
			return err
		}
		return errRollback
	})
	if err != nil && err != errRollback {
		tb.Fatal(err)
	}
	p := out[0].Plan
	return p.Hit, p.Read, p.Dirtied, p.WALRecs, p.WALBytes
}

// gaugeValue is the value of the gauge name in reg (-1: absent).
func gaugeValue(tb testing.TB, reg *prometheus.Registry, name string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
