package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/testenv"
)

// testEnv is an env on the test PostgreSQL (NUDGE_TEST_DATABASE_URL or
// testenv's default); a missing one fails the test under CI=true.
func testEnv(t *testing.T) *env {
	t.Helper()
	e := &env{dbURL: os.Getenv("NUDGE_TEST_DATABASE_URL")}
	if e.dbURL == "" {
		e.dbURL = testenv.DefaultDatabaseURL
	}
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, e.dbURL)
	if err == nil {
		err = admin.Ping(ctx)
	}
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", "NUDGE_TEST_DATABASE_URL", err)
	}
	e.admin = admin
	t.Cleanup(admin.Close)
	return e
}

// The scale tables are built as production holds reminders once lazy intake
// is on: the schema migrated with lazy intake on and without the state
// rows' foreign key, every reminder lazy and without a state row; the
// promoter then inserts the state rows of exactly the two due sets, pending,
// and leaves every reminder scheduled for later lazy without one, with its
// final watermark past the due sets.
func TestLazyScaleTable(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	scaleSchemaPrefix = "bench_scaletest" // not a leftover to a bench run on the same database
	const size, perSet = 2000, 120
	tb, err := buildScaleTable(ctx, e, "ScaleFill", size, perSet)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.close()

	var horizon time.Duration
	var fk bool
	if err := tb.pool.QueryRow(ctx, `SELECT (SELECT horizon FROM nudge_lazy_intake),
	        EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'reminder_state_id_fkey' AND conrelid = 'reminder_state'::regclass)`).
		Scan(&horizon, &fk); err != nil {
		t.Fatal(err)
	}
	if horizon != 2*time.Hour || fk {
		t.Errorf("after migrate: lazy intake's horizon %s, reminder_state_id_fkey present %v; want 2h0m0s, false", horizon, fk)
	}

	promos, err := promoteTables(ctx, []*scaleTable{tb})
	if err != nil {
		t.Fatal(err)
	}
	// Independently of checkPromoted: state rows against due times.
	var dueWithState, dueWithout, laterWithState, laterLazyWithout, notPending int
	var final time.Time
	if err := tb.pool.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE r.due_at <= $1 AND s.id IS NOT NULL),
       count(*) FILTER (WHERE r.due_at <= $1 AND s.id IS NULL),
       count(*) FILTER (WHERE r.due_at > $1 AND s.id IS NOT NULL),
       count(*) FILTER (WHERE r.due_at > $1 AND s.id IS NULL AND r.lazy),
       count(*) FILTER (WHERE s.id IS NOT NULL AND s.state <> 'pending'),
       (SELECT final_until FROM nudge_promoter)
  FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id`, tb.now).
		Scan(&dueWithState, &dueWithout, &laterWithState, &laterLazyWithout, &notPending, &final); err != nil {
		t.Fatal(err)
	}
	if dueWithState != 2*perSet || dueWithout != 0 || laterWithState != 0 || laterLazyWithout != size || notPending != 0 {
		t.Errorf("after the promotion: due with a state row %d, without %d; later with one %d, lazy without %d; not pending %d; want %d, 0, 0, %d, 0",
			dueWithState, dueWithout, laterWithState, laterLazyWithout, notPending, 2*perSet, size)
	}
	if !final.After(tb.now) {
		t.Errorf("final watermark %s, want after the due sets (cutoff %s)", final, tb.now)
	}
	p := promos[0]
	// The second sweep re-reads nothing: no writer was in flight at the
	// first one's read (schema 46; until then it re-read both sets).
	if c, s := p.share(perSet, 0), p.share(perSet, 1); c.Rows != perSet || s.Rows != perSet || c.RescanRead != 0 || s.RescanRead != 0 {
		t.Errorf("shares: clustered %+v, spread %+v; want %d rows and none re-read each", c, s, perSet)
	}
}

// A pass's time goes to the sets by the rows it read of each; a pass that
// read none (the one that completes a sweep) is split evenly.
func TestPromotionShare(t *testing.T) {
	p := promotion{Passes: []promotePass{
		{Sweep: 1, Offset: 0, Read: 80, Promoted: 80, Sec: 0.8, CPU: 0.4},
		{Sweep: 1, Offset: 80, Read: 80, Promoted: 80, Sec: 0.8, CPU: 0.4}, // 20 clustered, 60 spread
		{Sweep: 1, Offset: 160, Read: 40, Promoted: 40, Sec: 0.4, CPU: 0.2},
		{Sweep: 1, Offset: 200, Read: 0, Sec: 0.2, CPU: 0.1},
		{Sweep: 2, Offset: 0, Read: 200, Sec: 1.0, CPU: 0.5},
		{Sweep: 2, Offset: 200, Read: 0, Sec: 0.2, CPU: 0.1},
	}}
	c, s := p.share(100, 0), p.share(100, 1)
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	if c.Rows != 100 || s.Rows != 100 || !near(c.FirstSec, 0.8+0.2+0.1) || !near(s.FirstSec, 0.6+0.4+0.1) ||
		!near(c.RescanSec, 0.6) || !near(s.RescanSec, 0.6) || !near(c.Sec, 1.7) || !near(s.FirstCPU, 0.3+0.2+0.05) || !c.CPUKnown {
		t.Errorf("got clustered %+v, spread %+v", c, s)
	}
	p.Passes[0].CPU = -1
	if p.share(100, 0).CPUKnown {
		t.Error("a pass without its CPU must make the share's CPU unknown")
	}
	l := scaleLayout{Rows: []int{100, 100}, Spent: []float64{0.5, 1.0}, Promoted: promoterShare{Rows: 200, Sec: 1.0}}
	got := l.promoteClaimRates()
	if len(got) != 2 || !near(got[0], 100) || !near(got[1], 100.0/1.5) {
		t.Errorf("promoteClaimRates = %v, want [100 66.7]", got)
	}
}
