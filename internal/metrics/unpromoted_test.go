package metrics_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/metrics/metricstest"
	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/internal/testenv"
)

// unpromotedSQL is testdata/unpromoted.sql's statement called name.
var unpromotedSQL = func() func(string) string {
	queries := sync.OnceValues(func() (sqlfile.Queries, error) {
		src, err := os.ReadFile("testdata/unpromoted.sql")
		return sqlfile.Parse("testdata/unpromoted.sql", string(src)), err
	})
	return func(name string) string {
		q, err := queries()
		if err != nil {
			panic(err)
		}
		return q.Get(name)
	}
}()

// unpromotedTable is a table in the lazy layout: 120,000 lazy reminders due
// uniformly over [now − 30h, now + 30h), those due before now − 6h
// delivered (48,000 state rows of history), ANALYZEd and vacuumed, the
// promoter's row as the test sets it.
type unpromotedTable struct {
	db  *testenv.DB
	now time.Time
	reg *prometheus.Registry
}

func newUnpromotedTable(t *testing.T) *unpromotedTable {
	t.Helper()
	ctx := context.Background()
	db := testenv.Postgres(t)
	now := time.Now().UTC().Truncate(time.Second)
	exec := func(name string, args pgx.NamedArgs) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, unpromotedSQL(name), args)
		require.NoError(t, err, name)
	}
	exec("Fill", pgx.NamedArgs{"n": 120_000, "from": now.Add(-30 * time.Hour), "to": now.Add(30 * time.Hour)})
	exec("Delivered", pgx.NamedArgs{"before": now.Add(-6 * time.Hour)})
	_, err := db.Pool.Exec(ctx, `VACUUM ANALYZE reminders, reminder_state`)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewDBCollector(db.Pool, clock.NewFake(now)))
	return &unpromotedTable{db: db, now: now, reg: reg}
}

func (u *unpromotedTable) watermark(t *testing.T, final, prov time.Time) {
	t.Helper()
	_, err := u.db.Pool.Exec(context.Background(), unpromotedSQL("Watermark"), pgx.NamedArgs{"final": final, "prov": prov})
	require.NoError(t, err)
}

// gaugesBuffers is the shared buffers of the scrape's DBGauges statement.
func (u *unpromotedTable) gaugesBuffers(t testing.TB) int {
	t.Helper()
	args := pgx.NamedArgs{"now": u.now, "hour_ago": u.now.Add(-time.Hour), "unpromoted_limit": metrics.UnpromotedScrapeLimit}
	sharedBuffers(t, u.db, metrics.DBGaugesSQL(), args) // the session's first call plans and reads the catalogue
	return sharedBuffers(t, u.db, metrics.DBGaugesSQL(), args)
}

// plan is EXPLAIN's text of the scrape's read of the unpromoted reminders.
func (u *unpromotedTable) plan(t *testing.T) string {
	t.Helper()
	rows, err := u.db.Pool.Query(context.Background(), `EXPLAIN SELECT * FROM nudge_unpromoted_due($1, $2)`,
		u.now, metrics.UnpromotedScrapeLimit)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

func pendingSum(vs map[string]float64) float64 {
	n := 0.0
	for k, v := range vs {
		if strings.HasPrefix(k, "nudge_open_reminders{") && strings.Contains(k, `state="pending"`) {
			n += v
		}
	}
	return n
}

// Regression (issue 18, docs/benchmarks.md "The promoter under a long web
// transaction"): with final held back 3 hours by a web transaction open
// over many lazy reminders (emulated, as BenchmarkPromoterUnderLongTransaction
// does: sweeps kept completing up to now + H, final stayed), schema 39's
// nudge_unpromoted_due read the range [final, now] and hash-anti-joined it
// against all of reminder_state. From schema 43 the scrape starts at the
// provisional end, ahead of now: it reads no state row of history.
func TestScrapeUnderHeldBackFinalReadsNoHistory(t *testing.T) {
	t.Parallel()
	u := newUnpromotedTable(t)
	// Everything due before now + H was promoted and delivered or pending.
	_, err := u.db.Pool.Exec(context.Background(), unpromotedSQL("Delivered"), pgx.NamedArgs{"before": u.now.Add(-10 * time.Minute)})
	require.NoError(t, err)
	_, err = u.db.Pool.Exec(context.Background(), unpromotedSQL("Pending"),
		pgx.NamedArgs{"from": u.now.Add(-10 * time.Minute), "to": u.now.Add(time.Hour)})
	require.NoError(t, err)
	_, err = u.db.Pool.Exec(context.Background(), `VACUUM ANALYZE reminders, reminder_state`)
	require.NoError(t, err)
	u.watermark(t, u.now.Add(time.Hour), u.now.Add(time.Hour))
	steady := u.gaugesBuffers(t)
	u.watermark(t, u.now.Add(-3*time.Hour), u.now.Add(time.Hour))

	var pending int
	require.NoError(t, u.db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM reminder_state WHERE state = 'pending' AND due_at <= $1`, u.now).Scan(&pending))
	vs := values(t, u.reg)
	require.Equal(t, 1.0, vs["nudge_db_scrape_success"])
	require.Equal(t, float64(pending), pendingSum(vs), "the pending count is the promoted ones due")
	require.Greater(t, pending, 50)

	plan := u.plan(t)
	t.Logf("plan:\n%s", plan)
	require.NotContains(t, plan, "Hash Anti Join")
	require.NotContains(t, plan, "Seq Scan on reminder_state")

	var statePages int
	require.NoError(t, u.db.Pool.QueryRow(context.Background(),
		`SELECT pg_relation_size('reminder_state') / current_setting('block_size')::int`).Scan(&statePages))
	buffers := u.gaugesBuffers(t)
	t.Logf("reminder_state: %d pages; the scrape's DBGauges: %d buffers, %d with final where the provisional end is", statePages, buffers, steady)
	require.Greater(t, statePages, 400)
	require.Less(t, buffers, steady+20, "the held-back final costs the scrape nothing: it reads no state row of history")
}

// A dispatcher down for 6 hours: final and the provisional end both 6 h
// behind, every lazy reminder due since without a state row (12,000). The
// oldest due age shows the lag (the first alert), the pending count is at
// least the cap, and the scrape reads about the cap's worth of reminders
// (an index entry and a primary-key probe each), planned without a join
// that reads reminder_state whole. Fails on schema 39's function: its
// hash anti join (the plan), its count of every reminder of the range.
func TestScrapeOfADownDispatcherShowsTheAgeWithinACap(t *testing.T) {
	t.Parallel()
	u := newUnpromotedTable(t)
	behind := u.now.Add(-6 * time.Hour)
	u.watermark(t, behind, behind)

	plan := u.plan(t)
	t.Logf("plan:\n%s", plan)
	require.NotContains(t, plan, "Hash Anti Join")
	require.NotContains(t, plan, "Seq Scan on reminder_state")
	require.Contains(t, plan, "reminder_state_pkey", "a probe by primary key per reminder")

	var want []struct {
		Channel string
		N       int
		Oldest  time.Time
	}
	rows, err := u.db.Pool.Query(context.Background(), unpromotedSQL("Expected"), pgx.NamedArgs{"from": behind, "now": u.now})
	require.NoError(t, err)
	for rows.Next() {
		var w struct {
			Channel string
			N       int
			Oldest  time.Time
		}
		require.NoError(t, rows.Scan(&w.Channel, &w.N, &w.Oldest))
		want = append(want, w)
	}
	require.NoError(t, rows.Err())
	require.Len(t, want, 2)
	oldest := want[0].Oldest
	if want[1].Oldest.Before(oldest) {
		oldest = want[1].Oldest
	}
	require.Greater(t, want[0].N+want[1].N, 5*metrics.UnpromotedScrapeLimit)

	vs := values(t, u.reg)
	require.Equal(t, 1.0, vs["nudge_db_scrape_success"])
	require.InDelta(t, u.now.Sub(oldest).Seconds(), vs["nudge_oldest_due_age_seconds"], 1, "the lag shows as the oldest due age")
	require.Greater(t, vs["nudge_oldest_due_age_seconds"], (6*time.Hour - 5*time.Minute).Seconds())
	require.Equal(t, float64(metrics.UnpromotedScrapeLimit), pendingSum(vs), "at least the cap: the count stops there")

	buffers := u.gaugesBuffers(t)
	t.Logf("the scrape's DBGauges: %d buffers for a range of %d", buffers, want[0].N+want[1].N)
	require.Less(t, buffers, 6*metrics.UnpromotedScrapeLimit+1000, "an index descent and a probe per reminder read, up to the cap, and the rest of the scrape")
}

// A promoter a few minutes behind (a dispatcher run late), fewer reminders
// due without a state row than the cap, some of those in the range given
// their state rows by an operator's change (materialized, then canceled):
// the pending counts by channel and the oldest due age are exact, the
// canceled ones not counted.
func TestScrapeOfASlightlyLateDispatcherCountsExactly(t *testing.T) {
	t.Parallel()
	u := newUnpromotedTable(t)
	ctx := context.Background()
	// Promoted and delivered up to 20 minutes ago, the provisional end there.
	_, err := u.db.Pool.Exec(ctx, unpromotedSQL("Delivered"), pgx.NamedArgs{"before": u.now.Add(-20 * time.Minute)})
	require.NoError(t, err)
	behind := u.now.Add(-20 * time.Minute)
	u.watermark(t, behind.Add(-time.Hour), behind)
	_, err = u.db.Pool.Exec(ctx, `SELECT nudge_cancel_unchecked(r.tenant, r.key)
		FROM (SELECT tenant, key FROM reminders WHERE lazy AND due_at >= $1 AND due_at <= $2 ORDER BY id LIMIT 7) r`,
		behind, u.now)
	require.NoError(t, err)

	rows, err := u.db.Pool.Query(ctx, unpromotedSQL("Expected"), pgx.NamedArgs{"from": behind, "now": u.now})
	require.NoError(t, err)
	want := map[string]float64{}
	var oldest time.Time
	for rows.Next() {
		var ch string
		var n int
		var o time.Time
		require.NoError(t, rows.Scan(&ch, &n, &o))
		want[ch] = float64(n)
		if oldest.IsZero() || o.Before(oldest) {
			oldest = o
		}
	}
	require.NoError(t, rows.Err())
	require.Len(t, want, 2)
	require.Less(t, want["email"]+want["sms"], float64(metrics.UnpromotedScrapeLimit))
	require.Greater(t, want["email"]+want["sms"], 100.0)

	vs := values(t, u.reg)
	require.Equal(t, 1.0, vs["nudge_db_scrape_success"])
	for ch, n := range want {
		require.Equal(t, n, vs[`nudge_open_reminders{channel="`+ch+`",state="pending"}`], ch)
	}
	require.InDelta(t, u.now.Sub(oldest).Seconds(), vs["nudge_oldest_due_age_seconds"], 1)
}

// BenchmarkScrapeOfADownDispatcher measures the scrape (DBCollector) on
// newUnpromotedTable's layout scaled to NUDGE_BENCH_BIG lazy reminders
// (default 1,000,000) over 60 h, those due before now − 6h delivered, with
// final and the provisional end 6 h behind (a dispatcher down 6 h): 20
// scrapes timed, the DBGauges statement's buffers, and for contrast schema
// 39's body of nudge_unpromoted_due(now) run as a statement (buffers, wall).
//
//	NUDGE_BENCH_BIG=1000000 CI=true go test -count=1 ./internal/metrics -run '^$' -bench ScrapeOfADownDispatcher -benchtime 1x -v
func BenchmarkScrapeOfADownDispatcher(b *testing.B) {
	big := 1_000_000
	if v := os.Getenv("NUDGE_BENCH_BIG"); v != "" {
		_, err := fmt.Sscan(v, &big)
		require.NoError(b, err)
	}
	ctx := context.Background()
	db := testenv.Postgres(b)
	now := time.Now().UTC().Truncate(time.Second)
	for _, st := range []struct {
		name string
		args pgx.NamedArgs
	}{
		{"Fill", pgx.NamedArgs{"n": big, "from": now.Add(-30 * time.Hour), "to": now.Add(30 * time.Hour)}},
		{"Delivered", pgx.NamedArgs{"before": now.Add(-6 * time.Hour)}},
		{"Watermark", pgx.NamedArgs{"final": now.Add(-6 * time.Hour), "prov": now.Add(-6 * time.Hour)}},
	} {
		_, err := db.Pool.Exec(ctx, unpromotedSQL(st.name), st.args)
		require.NoError(b, err, st.name)
	}
	_, err := db.Pool.Exec(ctx, `VACUUM ANALYZE reminders, reminder_state`)
	require.NoError(b, err)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewDBCollector(db.Pool, clock.NewFake(now)))
	u := &unpromotedTable{db: db, now: now, reg: reg}
	for b.Loop() {
		for round := range 3 {
			var walls []time.Duration
			for range 20 {
				t0 := time.Now()
				_, err := reg.Gather()
				require.NoError(b, err)
				walls = append(walls, time.Since(t0))
			}
			slices.Sort(walls)
			t0 := time.Now()
			rows, err := db.Pool.Query(ctx, unpromotedSQL("Schema39Body"), pgx.NamedArgs{"due_by": now})
			require.NoError(b, err)
			n := 0
			for rows.Next() {
				n++
			}
			require.NoError(b, rows.Err())
			old := time.Since(t0)
			load, _ := os.ReadFile("/proc/loadavg")
			b.Logf("round %d, %d lazy, 6 h down: scrape median %s (min %s, max %s), DBGauges %d buffers; schema 39's read %s, %d buffers; load %s",
				round, big, walls[len(walls)/2], walls[0], walls[len(walls)-1], u.gaugesBuffers(b),
				old, sharedBuffers(b, db, unpromotedSQL("Schema39Body"), pgx.NamedArgs{"due_by": now}), strings.Fields(string(load))[0])
		}
	}
	vs := metricstest.Values(b, reg)
	b.Logf("oldest due age %.0f s, pending %.0f", vs["nudge_oldest_due_age_seconds"], pendingSum(vs))
}
