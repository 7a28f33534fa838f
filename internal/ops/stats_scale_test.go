package ops_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/ops/opstest"
	"github.com/nudgehq/nudge/internal/testenv"
)

// fillAtScale fills db as a SaaS that schedules months ahead holds it with
// lazy intake on (schema 44): n lazy reminders due 3 h to 30 days ahead
// without a state row, n/10 delivered reminders of the last days with their
// state rows (retention's history), and 1,000 pending reminders due in the
// last hour with theirs (the dispatcher's backlog); 16 tenants, channels
// alternating; a dispatcher run recorded a minute ago (so Stats reads the
// cutoff from dispatch_runs, as with a running fleet, not the fallback over
// events and terminal rows). ANALYZE after the fill, as autovacuum does.
func fillAtScale(tb testing.TB, db *testenv.DB, now time.Time, n int) {
	tb.Helper()
	ctx := context.Background()
	for _, sql := range []string{
		`INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key, lazy)
		 SELECT 'tenant-' || i % 16, 'lazy:' || i, CASE WHEN i % 2 = 0 THEN 'email' ELSE 'sms' END,
		        '+1415' || lpad(i::text, 7, '0'), 'course-expiry', '{}',
		        $1::timestamptz + interval '3 hours' + (i % 2592000) * interval '1 second',
		        $1::timestamptz + interval '4 hours' + (i % 2592000) * interval '1 second', 'lazy-' || i, true
		   FROM generate_series(1, $2::int) i`,
		`INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key)
		 SELECT 'tenant-' || i % 16, 'done:' || i, CASE WHEN i % 2 = 0 THEN 'email' ELSE 'sms' END,
		        '+1416' || lpad(i::text, 7, '0'), 'course-expiry', '{}',
		        $1::timestamptz - interval '2 hours' - (i % 864000) * interval '1 second',
		        $1::timestamptz - interval '1 hour' - (i % 864000) * interval '1 second', 'done-' || i
		   FROM generate_series(1, $2::int / 10) i`,
		`INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key)
		 SELECT 'tenant-' || i % 16, 'due:' || i, CASE WHEN i % 2 = 0 THEN 'email' ELSE 'sms' END,
		        '+1417' || lpad(i::text, 7, '0'), 'course-expiry', '{}',
		        $1::timestamptz - (i % 3600) * interval '1 second', $1::timestamptz + interval '2 hours', 'due-' || i
		   FROM generate_series(1, 1000) i WHERE $2::int > 0`,
		`INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, state, fence, attempts, finished_at, updated_at)
		 SELECT id, tenant, channel, due_at, deadline,
		        CASE WHEN key LIKE 'done:%' THEN 'delivered' ELSE 'pending' END,
		        CASE WHEN key LIKE 'done:%' THEN 1 ELSE 0 END, CASE WHEN key LIKE 'done:%' THEN 1 ELSE 0 END,
		        CASE WHEN key LIKE 'done:%' THEN due_at + interval '1 second' END, $1::timestamptz
		   FROM reminders WHERE NOT lazy AND $2::int > 0`,
	} {
		_, err := db.Pool.Exec(ctx, sql, now, n)
		require.NoError(tb, err, sql)
	}
	_, err := db.Pool.Exec(ctx, `ANALYZE reminders, reminder_state`)
	require.NoError(tb, err)
	require.NoError(tb, dispatch.RecordRun(ctx, db.Pool, "d", dispatch.Summary{Cutoff: now.Add(-time.Minute)},
		now.Add(-time.Minute), nil))
}

// BenchmarkStatsAtScale measures nudgectl stats' read (ops.ReadStats) on a
// 10,000-reminder control table and one of NUDGE_BENCH_BIG (default
// 1,000,000) lazy reminders scheduled for later (fillAtScale: plus a tenth
// of that in delivered history and 1,000 due), exact (StatsOptions.Exact:
// the read before issue 18's bound) and as nudgectl stats and the console
// read it by default, interleaved: NUDGE_BENCH_ROUNDS (6) rounds
// alternating the tables (control, big, big, control, ...), each timing
// NUDGE_BENCH_READS (5) reads of each kind, exact and default alternating. It reports each kind's wall time, the
// counting statement's shared buffers, and the estimate against the exact
// count.
//
//	NUDGE_BENCH_BIG=1000000 CI=true go test -count=1 ./internal/ops -run '^$' -bench StatsAtScale -benchtime 1x -v
func BenchmarkStatsAtScale(b *testing.B) {
	big, rounds, reads := 1_000_000, 6, 5
	for name, dst := range map[string]*int{"NUDGE_BENCH_BIG": &big, "NUDGE_BENCH_ROUNDS": &rounds, "NUDGE_BENCH_READS": &reads} {
		if v := os.Getenv(name); v != "" {
			_, err := fmt.Sscan(v, dst)
			require.NoError(b, err, name)
		}
	}
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	type table struct {
		n    int
		pool *pgxpool.Pool
	}
	build := func(n int) table {
		db := testenv.Postgres(b)
		start := time.Now()
		fillAtScale(b, db, now, n)
		b.Logf("%d: filled in %s", n, time.Since(start).Round(time.Second))
		// As nudgectl connects (internal/config): JIT off.
		cfg, err := pgxpool.ParseConfig(db.URL)
		require.NoError(b, err)
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(b, err)
		b.Cleanup(pool.Close)
		return table{n: n, pool: pool}
	}
	tables := []table{build(10_000), build(big)}
	for _, t := range tables {
		exact, err := ops.ReadStatsWith(ctx, t.pool, now, ops.StatsOptions{Exact: true})
		require.NoError(b, err)
		def, err := ops.ReadStats(ctx, t.pool, now)
		require.NoError(b, err)
		b.Logf("%d: estimated states %v; by channel, exact %v, default %v", t.n, def.Estimated,
			exact.ByChannel, def.ByChannel)
		b.Logf("%d: by tenant (tenant-3), exact %v, default %v", t.n, exact.ByTenant["tenant-3"], def.ByTenant["tenant-3"])
	}
	load := func() string {
		raw, err := os.ReadFile("/proc/loadavg")
		if err != nil {
			return "?"
		}
		return strings.Fields(string(raw))[0]
	}
	walls := map[string][]time.Duration{}
	for round := range rounds {
		order := []int{0, 1}
		if round%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			t := tables[i]
			var ex, def time.Duration
			for k := range 2 * reads {
				o := ops.StatsOptions{Exact: k%2 == 0}
				start := time.Now()
				_, err := ops.ReadStatsWith(ctx, t.pool, now, o)
				require.NoError(b, err)
				if o.Exact {
					ex += time.Since(start)
				} else {
					def += time.Since(start)
				}
			}
			ex, def = ex/time.Duration(reads), def/time.Duration(reads)
			walls[fmt.Sprint(t.n, " exact")] = append(walls[fmt.Sprint(t.n, " exact")], ex)
			walls[fmt.Sprint(t.n, " default")] = append(walls[fmt.Sprint(t.n, " default")], def)
			b.Logf("round %d, %d: ReadStats exact %s, default %s; load %s", round, t.n, ex.Round(time.Microsecond),
				def.Round(time.Microsecond), load())
		}
	}
	for _, t := range tables {
		exact := opstest.SharedBuffers(b, t.pool, ops.QuerySQL("StatsCounts"), pgx.NamedArgs{})
		var statePages, lazyPages int64
		require.NoError(b, t.pool.QueryRow(ctx, ops.QuerySQL("StatsPages")).Scan(&statePages, &lazyPages))
		pct := func(pages int64) float64 { return min(100, 100*ops.SamplePages/float64(max(pages, 1))) }
		bounded := opstest.SharedBuffers(b, t.pool, ops.QuerySQL("StatsCountsBounded"), pgx.NamedArgs{"now": now,
			"state_pct": pct(statePages), "state_pages": statePages, "lazy_pct": pct(lazyPages), "lazy_pages": lazyPages})
		for _, kind := range []string{"exact", "default"} {
			w := walls[fmt.Sprint(t.n, " ", kind)]
			sort.Slice(w, func(i, j int) bool { return w[i] < w[j] })
			b.Logf("%d %s: median %s (min %s, max %s)", t.n, kind, w[len(w)/2].Round(time.Microsecond),
				w[0].Round(time.Microsecond), w[len(w)-1].Round(time.Microsecond))
		}
		b.Logf("%d: buffers StatsCounts %d, StatsCountsBounded %d (pages: reminder_state %d, reminders %d)",
			t.n, exact, bounded, statePages, lazyPages)
	}
}
