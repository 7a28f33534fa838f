package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Issue 18's spread claim at 10M rows, and a design measured before
// building it: lazy state rows, promoted in due order (docs/benchmarks.md,
// "A due-ordered store for the spread claim"). Today every reminder gets its
// reminder_state row at intake, so the rows due in one minute lie on as many
// heap pages as there are of them, all over a table far larger than
// shared_buffers; in the lazy layout a reminder due beyond a horizon gets
// none, and a promoter inserts the state rows of a due range in due order
// (testdata/dueorder.sql), so they share pages whatever the table's size.

// testdataSQL returns the lookup of the statements of a testdata .sql file
// by name, the file read once; it panics on a missing file or name.
func testdataSQL(path string) func(name string) string {
	queries := sync.OnceValues(func() (sqlfile.Queries, error) {
		src, err := os.ReadFile(path)
		return sqlfile.Parse(path, string(src)), err
	})
	return func(name string) string {
		q, err := queries()
		if err != nil {
			panic(err)
		}
		return q.Get(name)
	}
}

// dueOrderSQL is testdata/dueorder.sql's statement called name.
var dueOrderSQL = testdataSQL("testdata/dueorder.sql")

// The prototype promoter that BenchmarkDueOrder measures is correct: it
// inserts the state rows of exactly the reminders due in its range that
// have none (a reminder due before the horizon got one at intake, a
// canceled one was materialized first and stays canceled), once however
// often it runs, and the dispatcher's claim then returns exactly the due
// reminders that are not canceled.
func TestDueOrderPromote(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	now := time.Now().UTC().Truncate(time.Second)
	for _, name := range []string{"DueOrderIndex", "LazyIntakeOn"} {
		_, err := db.Pool.Exec(ctx, dueOrderSQL(name))
		require.NoError(t, err, name)
	}
	_, err := db.Pool.Exec(ctx, dueOrderSQL("SetHorizon"), pgx.NamedArgs{"at": now.Add(2 * time.Hour)})
	require.NoError(t, err)

	// key prefix → how many, due when (relative to now)
	groups := []struct {
		prefix string
		n      int
		due    time.Duration
	}{
		{"due", 3, -30 * time.Minute},              // state row at intake
		{"soon", 4, 90 * time.Minute},              // before the horizon: state row at intake
		{"lazy", 5, 3 * time.Hour},                 // promoted
		{"edge", 6, 4*time.Hour - time.Second},     // promoted: the range's last second
		{"until", 2, 4 * time.Hour},                // the range's end, excluded
		{"later", 3, 48 * time.Hour},               // far beyond it
		{"canceled", 1, 3*time.Hour + time.Minute}, // materialized and canceled before the promoter ran
	}
	var reqs []intake.Request
	for _, g := range groups {
		for i := range g.n {
			due := now.Add(g.due)
			reqs = append(reqs, intake.Request{Tenant: fmt.Sprintf("tenant-%d", i%2), Key: fmt.Sprintf("%s:%d", g.prefix, i),
				Channel: reminder.SMS, Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
				Data: map[string]any{"course": "Go 101"}, DueAt: due, Deadline: due.Add(24 * time.Hour)})
		}
	}
	_, err = intake.ScheduleMany(ctx, db.Pool, reqs)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, dueOrderSQL("LazyIntakeOff"))
	require.NoError(t, err)

	withState := func() []string {
		rows, err := db.Pool.Query(ctx, `SELECT r.key || ' ' || s.state FROM reminder_state s JOIN reminders r ON r.id = s.id ORDER BY r.key`)
		require.NoError(t, err)
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return keys
	}
	keys := func(state string, prefixes ...string) []string {
		var out []string
		for _, g := range groups {
			if slices.Contains(prefixes, g.prefix) {
				for i := range g.n {
					out = append(out, fmt.Sprintf("%s:%d %s", g.prefix, i, state))
				}
			}
		}
		slices.Sort(out)
		return out
	}
	require.Equal(t, keys("pending", "due", "soon"), withState(), "state rows after lazy intake")

	// A write to a reminder not yet promoted materializes its state row
	// first, then proceeds as today.
	var canceledID int64
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT id FROM reminders WHERE key = 'canceled:0'`).Scan(&canceledID))
	_, err = db.Pool.Exec(ctx, dueOrderSQL("Materialize"), pgx.NamedArgs{"ids": []int64{canceledID}})
	require.NoError(t, err)
	st, err := intake.Cancel(ctx, db.Pool, "tenant-0", "canceled:0", "test", "changed my mind")
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, st)

	promote := func() int64 {
		tag, err := db.Pool.Exec(ctx, dueOrderSQL("Promote"), pgx.NamedArgs{"from": now.Add(2 * time.Hour), "until": now.Add(4 * time.Hour)})
		require.NoError(t, err)
		return tag.RowsAffected()
	}
	require.EqualValues(t, 11, promote(), "promoted: lazy and edge")
	require.EqualValues(t, 0, promote(), "promoted again")
	want := slices.Concat(keys("pending", "due", "soon", "lazy", "edge"), keys("canceled", "canceled"))
	slices.Sort(want)
	require.Equal(t, want, withState(), "state rows after the promoter")
	var dueAt time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT s.due_at FROM reminder_state s JOIN reminders r ON r.id = s.id
		WHERE r.key = 'edge:0'`).Scan(&dueAt))
	require.True(t, dueAt.Equal(now.Add(4*time.Hour-time.Second)), "a promoted row's due time: %s", dueAt)

	// The dispatcher's claim (this release's ClaimDue) at the range's end.
	at := now.Add(4 * time.Hour)
	var claimed []string
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, query("ClaimDue"), pgx.NamedArgs{"now": at, "cutoff": at, "limit": 500,
			"lease_until": at.Add(2 * time.Minute), "actor": "d"})
		if err != nil {
			return err
		}
		var ids []int64
		for rows.Next() {
			v, err := rows.Values()
			if err != nil {
				return err
			}
			ids = append(ids, v[0].(int64))
		}
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT key || ' enqueued' FROM reminders WHERE id = ANY($1) ORDER BY key`, ids)
		if err != nil {
			return err
		}
		claimed, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	require.NoError(t, err)
	require.Equal(t, keys("enqueued", "due", "soon", "lazy", "edge"), claimed, "claimed")
}

// The promoter's race with intake, measured here on the prototype
// (TestDueOrderPromoterRace), is tested on the real statements since schema
// 38: promote_test.go's TestPromoterRace.

// dueTable is one of BenchmarkDueOrder's tables and what was measured on it.
type dueTable struct {
	name        string
	lazy        bool
	history     bool // lazy, with a terminal state row for every reminder scheduled for later (HistoryFill)
	size        int
	db          *testenv.DB
	built       time.Duration
	vacuum      time.Duration // VACUUM of reminders before the second half of the promotion (lazy)
	claims      []float64     // rows/s of wall time of each claim
	claimed     int
	claimSecs   float64
	plan        planNode // one more claim's, under EXPLAIN
	promotes    [2][]promoteRun
	intakes     []intakeRun
	stateBytes  int64 // reminder_state with its indexes, after the promotion
	remBytes    int64 // reminders with its indexes
	dueIdxBytes int64 // reminders_due_order
}

// promoteRun is one Promote of a due range, under EXPLAIN (ANALYZE, BUFFERS,
// WAL, TIMING OFF).
type promoteRun struct {
	rows                  float64
	wall, cpu             time.Duration
	hit, read, dirtied    int64
	walRecs, walFPI, walB int64
	scan                  string // the plan's scan of reminders
	heapFetches           int64
}

// intakeRun is one ScheduleMany of far-future reminders, its WAL from
// pg_waldump (its own transaction).
type intakeRun struct {
	n             int
	cpu           time.Duration
	walRecs, walB int64
	stateRows     int // state rows the intake made
}

// BenchmarkDueOrder measures, against today's layout after the rollout
// (every reminder has a state row, made at intake: "full"), the lazy layout
// of testdata/dueorder.sql (state rows only for what is due before a
// horizon or promoted: "lazy"; and "history", lazy in its steady state,
// whose reminder_state also holds as many rows as reminders, terminal, in
// due order: HistoryFill), each at NUDGE_BENCH_BIG rows (default
// 1,000,000) and at a control of NUDGE_BENCH_SMALL (default 10,000), with
// NUDGE_BENCH_DUE (default 10,000) due rows spread evenly among them (as
// BenchmarkLayoutsSpreadClaim's). The six tables are built first (bulk
// load, indexes after, ANALYZE, autovacuum off, one CHECKPOINT); then,
// interleaved between the tables of a layout or all four:
//   - the promotion of the lazy and history tables' due rows in four slices of their due
//     hour: two on reminders as loaded (the visibility map unset: the
//     covering index's scan fetches heap pages), then a VACUUM of
//     reminders and a CHECKPOINT, then two more (index-only);
//   - the dispatcher's claim (this release's ClaimDue, batches of 500) on
//     all four, alternating the order;
//   - intake (ScheduleMany of 1,000 reminders due 1 to 31 days ahead)
//     twice on each, the lazy tables through a trigger that drops the state
//     row of a reminder due after the horizon (LazyIntakeOn).
//
// NUDGE_BENCH_KINDS (default full,lazy,history) chooses the layouts, full
// first; "nofk" is lazy without reminder_state's foreign key. It reports the figures and the promote+claim rate (one row's promotion
// and claim in sequence) against its control.
//
//	NUDGE_BENCH_BIG=10000000 go test ./internal/store -run '^$' -bench DueOrder -benchtime 1x -timeout 60m -v
func BenchmarkDueOrder(b *testing.B) {
	big, small, due := 1_000_000, 10_000, 10_000
	for _, v := range []struct {
		env string
		to  *int
	}{{"NUDGE_BENCH_BIG", &big}, {"NUDGE_BENCH_SMALL", &small}, {"NUDGE_BENCH_DUE", &due}} {
		if _, err := fmt.Sscan(envOr(v.env, fmt.Sprint(*v.to)), v.to); err != nil {
			b.Fatalf("%s: %v", v.env, err)
		}
	}
	const batch = 500
	ctx := context.Background()
	for range b.N {
		now := time.Now().UTC()
		var tables []*dueTable
		for _, kind := range strings.Split(envOr("NUDGE_BENCH_KINDS", "full,lazy,history"), ",") {
			for _, size := range []int{small, big} {
				tables = append(tables, buildDueTable(b, kind, size, due, now))
			}
		}
		if _, err := tables[0].db.Pool.Exec(ctx, `CHECKPOINT`); err != nil {
			b.Fatal(err)
		}
		lazies := tables[2:] // lazy and history

		// The promotion: the due rows lie in [now-60m, now-10m).
		cuts := []time.Time{now.Add(-2 * time.Hour), now.Add(-47*time.Minute - 30*time.Second), now.Add(-35 * time.Minute),
			now.Add(-22*time.Minute - 30*time.Second), now}
		for slice := range 4 {
			half := slice / 2
			if slice == 2 {
				for _, t := range lazies {
					started := time.Now()
					if _, err := t.db.Pool.Exec(ctx, `VACUUM reminders`); err != nil {
						b.Fatal(err)
					}
					t.vacuum = time.Since(started)
				}
				if _, err := tables[0].db.Pool.Exec(ctx, `CHECKPOINT`); err != nil {
					b.Fatal(err)
				}
			}
			order := slices.Clone(lazies)
			if slice%2 == 1 {
				slices.Reverse(order)
			}
			for _, t := range order {
				t.promotes[half] = append(t.promotes[half], promoteOnce(b, t.db, cuts[slice], cuts[slice+1]))
			}
		}
		for _, t := range tables {
			// The statistics of a table in its steady state, where some
			// pending rows (the last promoted) are always there: the history
			// table analyzed with none takes the claim's pending rows for one
			// and plans it on the wrong index (4× slower at 10k).
			if _, err := t.db.Pool.Exec(ctx, `ANALYZE reminder_state`); err != nil {
				b.Fatal(err)
			}
			t.stateBytes = relBytes(b, t.db, "pg_total_relation_size('reminder_state')")
			t.remBytes = relBytes(b, t.db, "pg_total_relation_size('reminders')")
			if t.lazy {
				t.dueIdxBytes = relBytes(b, t.db, "pg_relation_size('reminders_due_order')")
			}
		}

		// The claims, as BenchmarkLayoutsSpreadClaim's: one claim fewer
		// than the due rows fill, then one under EXPLAIN for its buffers.
		for i := range due/batch - 2 {
			order := slices.Clone(tables)
			if i%2 == 1 {
				slices.Reverse(order)
			}
			for _, t := range order {
				rows, wall, _ := claimOnce(b, t.db, layoutRelease, now, batch)
				if rows < batch*9/10 {
					b.Fatalf("%s: claimed %d of %d", t.name, rows, batch)
				}
				t.claims = append(t.claims, float64(rows)/wall.Seconds())
				t.claimed += rows
				t.claimSecs += wall.Seconds()
			}
		}
		for _, t := range tables {
			t.plan = explainClaim(b, t.db, layoutRelease, now, batch)
			if os.Getenv("NUDGE_BENCH_PLANS") != "" {
				var sb strings.Builder
				textPlan(&sb, t.plan, 0)
				b.Logf("%s: one more claim's plan\n%s", t.name, sb.String())
			}
		}

		// Intake of far-future reminders.
		for _, t := range lazies {
			if _, err := t.db.Pool.Exec(ctx, dueOrderSQL("LazyIntakeOn")); err != nil {
				b.Fatal(err)
			}
			if _, err := t.db.Pool.Exec(ctx, dueOrderSQL("SetHorizon"), pgx.NamedArgs{"at": time.Now().Add(2 * time.Hour)}); err != nil {
				b.Fatal(err)
			}
		}
		for round := range 2 {
			order := slices.Clone(tables)
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, t := range order {
				t.intakes = append(t.intakes, intakeOnce(b, t, round, 1000))
			}
		}
		b.Log(dueOrderReport(tables, due))
	}
}

// buildDueTable builds one table: a schema after the rollout, n rows of
// DueFill loaded by two sessions with the secondary indexes dropped, then
// (full) every row's state row or (lazy) the covering index (history: and
// HistoryFill's state rows), the indexes
// rebuilt, ANALYZE, autovacuum off.
func buildDueTable(tb testing.TB, kind string, size, due int, now time.Time) *dueTable {
	ctx := context.Background()
	started := time.Now()
	lazy := kind != "full"
	t := &dueTable{name: fmt.Sprintf("%s %d", kind, size), lazy: lazy, history: kind == "history", size: size, db: testenv.Postgres(tb)}
	// The prototype's layouts: intake lazy only through its trigger
	// (LazyIntakeOn), not schema 44's setting. Since 44 no layout has
	// reminder_state's foreign key, so "nofk" measures as "lazy" does; the
	// figures in docs/benchmarks.md with the key were measured before 44.
	setLazyIntake(tb, t.db, nil)
	pool := t.db.Pool
	rows, err := pool.Query(ctx, dueOrderSQL("DeferredIndexes"))
	if err != nil {
		tb.Fatal(err)
	}
	type deferred struct{ Drop, Build string }
	defs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[deferred])
	if err != nil {
		tb.Fatal(err)
	}
	for _, q := range []string{"ALTER TABLE reminders SET (autovacuum_enabled = false)",
		"ALTER TABLE reminder_state SET (autovacuum_enabled = false)"} {
		if _, err := pool.Exec(ctx, q); err != nil {
			tb.Fatal(err)
		}
	}
	for _, d := range defs {
		if _, err := pool.Exec(ctx, d.Drop); err != nil {
			tb.Fatalf("%s: %v", d.Drop, err)
		}
	}
	total := size + due
	const chunk = 500_000
	var jobs []func(*pgxpool.Conn) error
	for first := 1; first <= total; first += chunk {
		args := pgx.NamedArgs{"first": first, "last": min(first+chunk-1, total), "total": total, "due": due, "now": now}
		jobs = append(jobs, func(c *pgxpool.Conn) error {
			_, err := c.Exec(ctx, dueOrderSQL("DueFill"), args)
			return err
		})
	}
	runParallel(tb, pool, jobs)
	if !lazy {
		var lo, hi int64
		if err := pool.QueryRow(ctx, `SELECT min(id), max(id) FROM reminders`).Scan(&lo, &hi); err != nil {
			tb.Fatal(err)
		}
		jobs = nil
		for first := lo; first <= hi; first += chunk {
			args := pgx.NamedArgs{"first": first, "last": first + chunk - 1}
			jobs = append(jobs, func(c *pgxpool.Conn) error {
				// the foreign key's check per row is the intake's cost, not
				// this load's
				if _, err := c.Exec(ctx, `SET session_replication_role = replica`); err != nil {
					return err
				}
				defer c.Exec(ctx, `RESET session_replication_role`) //nolint:errcheck
				_, err := c.Exec(ctx, dueOrderSQL("StateFill"), args)
				return err
			})
		}
		runParallel(tb, pool, jobs)
	}
	if t.history {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// the foreign key's check locks each reminders row (FOR KEY
			// SHARE): a write of every page of reminders that is no part
			// of the layout
			for _, q := range []string{`SET LOCAL work_mem = '256MB'`, `SET LOCAL session_replication_role = replica`} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, dueOrderSQL("HistoryFill"), pgx.NamedArgs{"now": now})
			return err
		})
		if err != nil {
			tb.Fatalf("HistoryFill: %v", err)
		}
	}
	jobs = nil
	builds := make([]string, 0, len(defs)+1)
	for _, d := range defs {
		builds = append(builds, d.Build)
	}
	if lazy {
		builds = append(builds, dueOrderSQL("DueOrderIndex"))
	}
	for _, q := range builds {
		jobs = append(jobs, func(c *pgxpool.Conn) error {
			if _, err := c.Exec(ctx, `SET maintenance_work_mem = '512MB'`); err != nil {
				return err
			}
			_, err := c.Exec(ctx, q)
			return err
		})
	}
	runParallel(tb, pool, jobs)
	if kind == "nofk" {
		// lazy without reminder_state's foreign key: its check locks the
		// promoted reminder's wide row (FOR KEY SHARE), a write to a page
		// of reminders per promoted row, spread as the due rows are
		if _, err := pool.Exec(ctx, `ALTER TABLE reminder_state DROP CONSTRAINT IF EXISTS reminder_state_id_fkey`); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE reminders, reminder_state`); err != nil {
		tb.Fatal(err)
	}
	t.built = time.Since(started)
	tb.Logf("%s: built in %s", t.name, t.built.Round(time.Second))
	return t
}

// runParallel runs the jobs over two connections and fails on the first
// error.
func runParallel(tb testing.TB, pool *pgxpool.Pool, jobs []func(*pgxpool.Conn) error) {
	ctx := context.Background()
	ch := make(chan func(*pgxpool.Conn) error)
	errs := make(chan error, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pool.Acquire(ctx)
			if err != nil {
				errs <- err
				for range ch {
				}
				return
			}
			defer c.Release()
			var first error
			for j := range ch {
				if first == nil {
					first = j(c)
				}
			}
			errs <- first
		}()
	}
	for _, j := range jobs {
		ch <- j
	}
	close(ch)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
}

// promotePlan is the part of Promote's EXPLAIN that names its scan.
type promotePlan struct {
	NodeType    string        `json:"Node Type"`
	Relation    string        `json:"Relation Name"`
	Index       string        `json:"Index Name"`
	HeapFetches int64         `json:"Heap Fetches"`
	Plans       []promotePlan `json:"Plans"`
}

func (p promotePlan) scan() (string, int64) {
	if p.Relation == "reminders" {
		return strings.TrimSpace(p.NodeType + " " + p.Index), p.HeapFetches
	}
	for _, c := range p.Plans {
		if s, n := c.scan(); s != "" {
			return s, n
		}
	}
	return "", 0
}

// promoteOnce runs Promote for [from, until) under EXPLAIN (ANALYZE,
// BUFFERS, WAL, TIMING OFF), in a transaction of its own, committed.
func promoteOnce(tb testing.TB, db *testenv.DB, from, until time.Time) promoteRun {
	ctx := context.Background()
	conn, pid := backend(tb, db)
	defer conn.Release()
	var raw []byte
	cpu0, started := onCPU(pid), time.Now()
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, WAL, TIMING OFF, FORMAT JSON) "+dueOrderSQL("Promote"),
			pgx.NamedArgs{"from": from, "until": until}).Scan(&raw)
	})
	r := promoteRun{wall: time.Since(started), cpu: time.Duration(onCPU(pid) - cpu0)}
	if err != nil {
		tb.Fatalf("Promote: %v", err)
	}
	var out []struct {
		Plan struct {
			planNode
			Inserted float64 `json:"Tuples Inserted"`
		}
	}
	var scan []struct{ Plan promotePlan }
	if err := json.Unmarshal(raw, &out); err != nil {
		tb.Fatal(err)
	}
	if err := json.Unmarshal(raw, &scan); err != nil {
		tb.Fatal(err)
	}
	p := out[0].Plan
	r.rows = p.Inserted
	if r.rows == 0 && len(p.Plans) > 0 {
		r.rows = p.Plans[0].Rows
	}
	r.hit, r.read, r.dirtied = p.Hit, p.Read, p.Dirtied
	r.walRecs, r.walFPI, r.walB = p.WALRecords, p.WALFPI, p.WALBytes
	r.scan, r.heapFetches = scan[0].Plan.scan()
	if r.rows == 0 {
		tb.Fatalf("Promote [%s, %s) inserted nothing", from, until)
	}
	return r
}

// intakeOnce schedules n reminders due 1 to 31 days ahead with
// ScheduleMany, in a transaction of its own, and measures its backend's CPU
// and (pg_waldump) its WAL.
func intakeOnce(tb testing.TB, t *dueTable, round, n int) intakeRun {
	ctx := context.Background()
	now := time.Now()
	reqs := make([]intake.Request, n)
	for i := range reqs {
		due := now.Add(24*time.Hour + time.Duration(rand.Int64N(int64(30*24*time.Hour))))
		reqs[i] = intake.Request{Tenant: fmt.Sprintf("tenant-%d", i%16), Key: fmt.Sprintf("intake:%d:%d", round, i),
			Channel: reminder.SMS, Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
			Data: map[string]any{"course": "Go 101"}, DueAt: due, Deadline: due.Add(24 * time.Hour)}
	}
	conn, pid := backend(tb, t.db)
	defer conn.Release()
	var lsn0, lsn1 string
	var xid int64
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn0); err != nil {
		tb.Fatal(err)
	}
	cpu0 := onCPU(pid)
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT txid_current() % 4294967296`).Scan(&xid); err != nil {
			return err
		}
		_, err := intake.ScheduleMany(ctx, tx, reqs)
		return err
	})
	r := intakeRun{n: n, cpu: time.Duration(onCPU(pid) - cpu0)}
	if err != nil {
		tb.Fatalf("ScheduleMany: %v", err)
	}
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn1); err != nil {
		tb.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM reminder_state s JOIN reminders r ON r.id = s.id
		WHERE r.key LIKE $1`, fmt.Sprintf("intake:%d:%%", round)).Scan(&r.stateRows); err != nil {
		tb.Fatal(err)
	}
	name := "intake " + t.name
	cs := costs{by: map[string]*cost{name: {rows: n}}, xids: map[int64]string{xid: name}}
	if w := cs.walDump(tb, lsn0, lsn1, relations(tb, t.db))[name]; w != nil {
		r.walRecs, r.walB = w.recs, w.bytes
	}
	return r
}

func relBytes(tb testing.TB, db *testenv.DB, expr string) int64 {
	var n int64
	if err := db.Pool.QueryRow(context.Background(), `SELECT `+expr).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// dueOrderReport prints every table's figures, then promote+claim.
func dueOrderReport(tables []*dueTable, due int) string {
	var sb strings.Builder
	list := func(xs []float64, format string) string {
		var out []string
		for _, x := range xs {
			out = append(out, fmt.Sprintf(format, x))
		}
		return strings.Join(out, " / ")
	}
	fmt.Fprintf(&sb, "\ntables (%d due rows each)\n", due)
	for _, t := range tables {
		fmt.Fprintf(&sb, "%-14s built %s | reminders %.0f MB | reminder_state %.1f MB after the promotion | due-order index %.0f MB | VACUUM reminders %s\n",
			t.name, t.built.Round(time.Second), float64(t.remBytes)/1e6, float64(t.stateBytes)/1e6, float64(t.dueIdxBytes)/1e6,
			t.vacuum.Round(100*time.Millisecond))
	}
	fmt.Fprintf(&sb, "\npromotion, per promoted row, each slice in order: rows/s of wall | CPU µs | hit | read | dirtied | WAL records | FPI | WAL B | scan (heap fetches/row)\n")
	for _, t := range tables {
		if !t.lazy {
			continue
		}
		for half, label := range []string{"as loaded", "vacuumed"} {
			var rate, cpu, hit, read, dirt, recs, fpi, wb []float64
			var scans []string
			for _, p := range t.promotes[half] {
				rate = append(rate, p.rows/p.wall.Seconds())
				cpu = append(cpu, float64(p.cpu.Microseconds())/p.rows)
				hit = append(hit, float64(p.hit)/p.rows)
				read = append(read, float64(p.read)/p.rows)
				dirt = append(dirt, float64(p.dirtied)/p.rows)
				recs = append(recs, float64(p.walRecs)/p.rows)
				fpi = append(fpi, float64(p.walFPI)/p.rows)
				wb = append(wb, float64(p.walB)/p.rows)
				scans = append(scans, fmt.Sprintf("%s (%.2f)", p.scan, float64(p.heapFetches)/p.rows))
			}
			fmt.Fprintf(&sb, "%-14s %-9s %s | %s | %s | %s | %s | %s | %s | %s | %s\n", t.name, label, list(rate, "%.0f"), list(cpu, "%.1f"),
				list(hit, "%.2f"), list(read, "%.2f"), list(dirt, "%.3f"), list(recs, "%.2f"), list(fpi, "%.3f"), list(wb, "%.0f"),
				strings.Join(scans, " / "))
		}
	}
	fmt.Fprintf(&sb, "\nclaim (ClaimDue, 500 a claim): rows/s of wall, median (min–max), × its control; one more claim's buffers per row\n")
	claimRate := func(t *dueTable) float64 { return median(t.claims) }
	for i, t := range tables {
		ctl := tables[i-i%2]
		r := max(t.plan.Rows, 1)
		fmt.Fprintf(&sb, "%-14s %6.0f (%.0f–%.0f) %.2f× | hit %.1f read %.1f dirtied %.2f\n", t.name, claimRate(t),
			slices.Min(t.claims), slices.Max(t.claims), claimRate(t)/claimRate(ctl),
			float64(t.plan.Hit)/r, float64(t.plan.Read)/r, float64(t.plan.Dirtied)/r)
	}
	fmt.Fprintf(&sb, "\npromote+claim: 1 / (1/promote rate + 1/claim rate), medians; × its control and × full's control\n")
	fullCtl := claimRate(tables[0])
	for i, t := range tables {
		ctl := tables[i-i%2]
		for half, label := range []string{"as loaded", "vacuumed"} {
			both := func(t *dueTable) float64 {
				if !t.lazy {
					return claimRate(t)
				}
				var rates []float64
				for _, p := range t.promotes[half] {
					rates = append(rates, p.rows/p.wall.Seconds())
				}
				return 1 / (1/median(rates) + 1/claimRate(t))
			}
			if !t.lazy && half == 1 {
				continue
			}
			fmt.Fprintf(&sb, "%-14s %-9s %6.0f rows/s, %.2f× its control, %.2f× full's control\n", t.name, label, both(t),
				both(t)/both(ctl), both(t)/fullCtl)
		}
	}
	fmt.Fprintf(&sb, "\nintake of 1,000 reminders due 1–31 days ahead, per reminder, each run in order: WAL records | WAL B | CPU µs | state rows made\n")
	for _, t := range tables {
		var recs, wb, cpu, made []float64
		for _, in := range t.intakes {
			recs = append(recs, float64(in.walRecs)/float64(in.n))
			wb = append(wb, float64(in.walB)/float64(in.n))
			cpu = append(cpu, float64(in.cpu.Microseconds())/float64(in.n))
			made = append(made, float64(in.stateRows))
		}
		fmt.Fprintf(&sb, "%-14s %s | %s | %s | %s\n", t.name, list(recs, "%.1f"), list(wb, "%.0f"), list(cpu, "%.0f"), list(made, "%.0f"))
	}
	return sb.String()
}
