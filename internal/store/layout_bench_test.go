package store

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/internal/testenv"
)

// Issue 18's question before building it: how much would moving the hot
// columns off the wide reminders row save per delivered reminder? Two
// layouts (testdata/layouts.sql) against today's, each in a scratch schema of
// its own: the real migrations, the real intake, then the layout's Setup.
//
// Since schema version 32 the real migrations create reminder_state and its
// mirror, and internal/store's statements write it. The comparison stays
// the design's, without the mirror: every layout's schema first drops the
// mirror triggers and the real reminder_state (testdata/layouts.sql's
// DropMirror), and "today" means the statements of schema version 31, the
// last release before the move (testdata/queries_v31.sql, verbatim from git
// show 0dbb7c8:internal/store/queries.sql), on the wide reminders row alone.

// layout is where a reminder's columns live. Today's is one table; the
// others split it in two: hot (state, fence, leases, the happy path's slots,
// and every index whose predicate names state), which the three hot
// statements rewrite, and cold (the payload and the own window), which they
// only read.
type layout struct {
	name      string
	hot, cold string
	claimFrom string // where the dispatcher's claim reads zone, window and key: cold unless set
	setup     string // the testdata/layouts.sql statement that builds it from today's
	// release runs this release's statements (queries.sql) on the real
	// schema, mirror included, instead of a layout without the mirror.
	release bool
}

var (
	// layoutToday is schema version 31's statements on the wide row, the
	// mirror dropped: what the layouts are measured against.
	layoutToday = layout{name: "today", hot: "reminders"}
	// layoutRelease is this release's statements as the binaries run them
	// (on reminder_state, mirrored to reminders): BenchmarkStatementCosts'.
	layoutRelease = layout{name: "release", hot: "reminder_state", release: true}
	layoutNarrow  = layout{name: "A narrow", hot: "reminder_state", cold: "reminders", setup: "SetupNarrow"}
	layoutSplit   = layout{name: "B split", hot: "reminders", cold: "reminder_payloads", setup: "SetupSplit"}
	// A' is A whose dispatcher's claim reads no wide row (testdata/layouts.sql).
	layoutNarrowOnly = layout{name: "A' narrow", hot: "reminder_state", cold: "reminders", setup: "SetupNarrow",
		claimFrom: "(SELECT id, tz, window_open, window_close, window_days, NULL::text AS idempotency_key FROM reminder_state)"}
)

// layoutQueries are testdata/layouts.sql's statements.
var layoutQueries = sync.OnceValues(func() (sqlfile.Queries, error) {
	src, err := os.ReadFile("testdata/layouts.sql")
	return sqlfile.Parse("testdata/layouts.sql", string(src)), err
})

// v31Queries are internal/store's statements of schema version 31, the
// layouts' "today".
var v31Queries = sync.OnceValues(func() (sqlfile.Queries, error) {
	src, err := os.ReadFile("testdata/queries_v31.sql")
	return sqlfile.Parse("testdata/queries_v31.sql", string(src)), err
})

// layoutSQL is testdata/layouts.sql's statement called name, with the
// layout's tables.
func (l layout) layoutSQL(name string) string {
	q, err := layoutQueries()
	if err != nil {
		panic(err)
	}
	return strings.NewReplacer("{hot}", l.hot, "{cold}", l.cold, "{claim_from}", cmp.Or(l.claimFrom, l.cold)).Replace(q.Get(name))
}

// sql is the statement called name as the layout runs it: the three that
// rewrite the reminder from testdata/layouts.sql, any other (the
// dispatcher's confirmation) as today (schema version 31); this release's
// own from queries.sql.
func (l layout) sql(name string) string {
	if l.release {
		return query(name)
	}
	if l.cold != "" && slices.Contains([]string{"ClaimDue", "ClaimForDelivery", "RecordOutcomes"}, name) {
		return l.layoutSQL(name)
	}
	q, err := v31Queries()
	if err != nil {
		panic(err)
	}
	return q.Get(name)
}

// build moves a schema's reminders (scheduled through the intake) into
// the layout's tables, after dropping the mirror (all but this release's).
func (l layout) build(tb testing.TB, db *testenv.DB) {
	tb.Helper()
	if l.release {
		return
	}
	names := []string{"DropMirror"}
	if l.setup != "" {
		names = append(names, l.setup, "StateIndexes")
	}
	for _, name := range names {
		if _, err := db.Pool.Exec(context.Background(), l.layoutSQL(name)); err != nil {
			tb.Fatalf("%s: %v", name, err)
		}
	}
}

// layoutRun is one run of the hot path in one layout, per delivered reminder.
type layoutRun struct {
	walRecs, walBytes float64            // pg_waldump, the statements' own transactions
	cpuUS             float64            // backend CPU, µs
	hit, dirtied      float64            // shared buffers
	hotShare          float64            // updates of the hot table that were HOT
	attHotShare       float64            // the same for delivery_attempts
	relBytes          map[string]float64 // WAL bytes by relation
	hotRowBytes       float64            // the hot table's heap bytes per row, before the claims
	stmtRecs          map[string]float64 // WAL records by statement
}

func runLayout(b *testing.B, lay layout, n, rounds int) layoutRun {
	ctx := context.Background()
	db := testenv.PostgresBeforeRollout(b)
	scheduleDue(b, db, n)
	lay.build(b, db)
	// Every layout's tables read once before the runs, so that no claim
	// pays for setting the hint bits of rows fresher than another's.
	for _, t := range []string{lay.hot, lay.cold} {
		if t == "" {
			continue
		}
		if _, err := db.Pool.Exec(ctx, `SELECT count(*) FROM `+t); err != nil {
			b.Fatal(err)
		}
		if os.Getenv("NUDGE_BENCH_ANALYZE") != "" {
			if _, err := db.Pool.Exec(ctx, `ANALYZE `+t); err != nil {
				b.Fatal(err)
			}
		}
	}
	var hotRowBytes float64
	if err := db.Pool.QueryRow(ctx, `SELECT pg_relation_size($1::regclass)::float8 / count(*) FROM `+lay.hot, lay.hot).
		Scan(&hotRowBytes); err != nil {
		b.Fatal(err)
	}
	cs, lsn0, lsn1 := hotPath(b, db, lay, rounds)
	cs.report(b)
	wal := cs.walDump(b, lsn0, lsn1, relations(b, db))
	delivered := float64(cs.by["RecordOutcomes"].rows)
	r := layoutRun{relBytes: map[string]float64{}, stmtRecs: map[string]float64{}, hotRowBytes: hotRowBytes}
	for _, c := range cs.by {
		r.cpuUS += float64(c.cpuNS) / 1000 / delivered
		r.hit += float64(c.hit) / delivered
		r.dirtied += float64(c.dirtied) / delivered
	}
	var hot, nonHot, attHot, attNonHot int64
	for name, w := range wal {
		r.walRecs += float64(w.recs) / delivered
		r.walBytes += float64(w.bytes) / delivered
		r.stmtRecs[name] = float64(w.recs) / delivered
		for rel, n := range w.relBytes {
			r.relBytes[rel] += float64(n) / delivered
		}
		hot += w.kinds[lay.hot+" HOT_UPDATE"]
		nonHot += w.kinds[lay.hot+" UPDATE"]
		attHot += w.kinds["delivery_attempts HOT_UPDATE"]
		attNonHot += w.kinds["delivery_attempts UPDATE"]
	}
	r.hotShare = float64(hot) / float64(max(hot+nonHot, 1))
	r.attHotShare = float64(attHot) / float64(max(attHot+attNonHot, 1))
	return r
}

// BenchmarkLayouts runs a delivered reminder's statements (as
// BenchmarkStatementCosts does: the dispatcher's claim and confirmation,
// the worker's claim and outcome) in today's layout and in the two of
// testdata/layouts.sql, interleaved (today, A, B, today, A, B, ...), each
// run on a fresh schema of NUDGE_BENCH_N (default 20,000) due reminders
// scheduled through the intake, NUDGE_BENCH_ROUNDS (default 4) claims of
// 500 each, NUDGE_BENCH_REPEAT (default 3) times; it reports per delivered
// reminder the WAL (pg_waldump: records, bytes, bytes by relation), the
// backends' CPU and the share of the rewrites that were HOT.
//
//	NUDGE_BENCH_TIMING=off go test ./internal/store -run '^$' -bench Layouts -benchtime 1x -v
func BenchmarkLayouts(b *testing.B) {
	n, repeat := 20000, 3
	if _, err := fmt.Sscan(envOr("NUDGE_BENCH_N", "20000"), &n); err != nil {
		b.Fatal(err)
	}
	if _, err := fmt.Sscan(envOr("NUDGE_BENCH_REPEAT", "3"), &repeat); err != nil {
		b.Fatal(err)
	}
	rounds := benchRounds(b, n)
	lays := []layout{layoutToday, layoutNarrow, layoutSplit}
	for range b.N {
		runs := map[string][]layoutRun{}
		for range repeat {
			for _, lay := range lays {
				runs[lay.name] = append(runs[lay.name], runLayout(b, lay, n, rounds))
			}
		}
		b.Log(layoutReport(lays, runs))
	}
}

// layoutReport prints every run's figures per layout, then the WAL bytes by
// relation of each layout's median run (by WAL bytes).
func layoutReport(lays []layout, runs map[string][]layoutRun) string {
	var sb strings.Builder
	col := func(rs []layoutRun, f func(layoutRun) float64, format string) string {
		var out []string
		for _, r := range rs {
			out = append(out, fmt.Sprintf(format, f(r)))
		}
		return strings.Join(out, " / ")
	}
	fmt.Fprintf(&sb, "\nper delivered reminder, runs in order (interleaved)\n")
	for _, lay := range lays {
		rs := runs[lay.name]
		fmt.Fprintf(&sb, "%-9s WAL records %s | WAL B %s | CPU µs %s | hit %s | dirtied %s | HOT %s (attempts %s) | hot heap B/row %s\n",
			lay.name, col(rs, func(r layoutRun) float64 { return r.walRecs }, "%.1f"),
			col(rs, func(r layoutRun) float64 { return r.walBytes }, "%.0f"),
			col(rs, func(r layoutRun) float64 { return r.cpuUS }, "%.0f"),
			col(rs, func(r layoutRun) float64 { return r.hit }, "%.1f"),
			col(rs, func(r layoutRun) float64 { return r.dirtied }, "%.2f"),
			col(rs, func(r layoutRun) float64 { return r.hotShare }, "%.2f"),
			col(rs, func(r layoutRun) float64 { return r.attHotShare }, "%.2f"),
			col(rs, func(r layoutRun) float64 { return r.hotRowBytes }, "%.0f"))
	}
	fmt.Fprintf(&sb, "\nWAL of the median run by statement (records) and by relation (bytes), per delivered reminder\n")
	for _, lay := range lays {
		rs := slices.Clone(runs[lay.name])
		if len(rs) == 0 {
			continue
		}
		slices.SortFunc(rs, func(a, b layoutRun) int { return int(a.walBytes - b.walBytes) })
		m := rs[len(rs)/2]
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m.stmtRecs)) {
			parts = append(parts, fmt.Sprintf("%s %.1f", k, m.stmtRecs[k]))
		}
		fmt.Fprintf(&sb, "%-9s %s\n", lay.name, strings.Join(parts, ", "))
		parts = nil
		for _, k := range slices.Sorted(maps.Keys(m.relBytes)) {
			if m.relBytes[k] >= 1 {
				parts = append(parts, fmt.Sprintf("%s %.0f", k, m.relBytes[k]))
			}
		}
		fmt.Fprintf(&sb, "%-9s %s\n", "", strings.Join(parts, ", "))
	}
	return sb.String()
}

// BenchmarkLayoutsSpreadClaim measures the dispatcher's claim at a large
// table whose due rows are spread over it (testdata/layouts.sql's
// SpreadFill: NUDGE_BENCH_BIG rows, default 1,000,000, scheduled for later
// in random due order, and NUDGE_BENCH_DUE, default 10,000, due among them
// evenly over the id range),
// against a control of NUDGE_BENCH_SMALL (default 10,000) built the same
// way, in today's layout, in layout A and in A' (A's claim reading no wide
// row). The six tables are built first (each in a schema of its own,
// vacuumed and analyzed, then one checkpoint), then claimed from in batches
// of 500, alternately (control, big, A's control, A's big, ..., then the
// reverse order) so a slow minute of the machine spreads over all; it
// reports each table's claimed rows per second of wall time and
// of its backend's CPU, median with min and max, and the ratio of each big
// table to its own layout's control.
//
//	go test ./internal/store -run '^$' -bench LayoutsSpreadClaim -benchtime 1x -v
func BenchmarkLayoutsSpreadClaim(b *testing.B) {
	big, small, due := 1_000_000, 10_000, 10_000
	if _, err := fmt.Sscan(envOr("NUDGE_BENCH_BIG", "1000000"), &big); err != nil {
		b.Fatal(err)
	}
	if _, err := fmt.Sscan(envOr("NUDGE_BENCH_SMALL", "10000"), &small); err != nil {
		b.Fatal(err)
	}
	if _, err := fmt.Sscan(envOr("NUDGE_BENCH_DUE", "10000"), &due); err != nil {
		b.Fatal(err)
	}
	const batch = 500
	for range b.N {
		now := time.Now()
		type table struct {
			name      string
			lay       layout
			db        *testenv.DB
			wall, cpu []float64 // rows/s of each claim
			plan      planNode  // the last claim's, under EXPLAIN
		}
		var tables []*table
		for _, lay := range []layout{layoutToday, layoutNarrow, layoutNarrowOnly} {
			for _, size := range []int{small, big} {
				started := time.Now()
				t := &table{name: fmt.Sprintf("%s %d", lay.name, size), lay: lay, db: testenv.PostgresBeforeRollout(b)}
				spreadFill(b, t.db, lay, size, due, now)
				b.Logf("%s: built in %s", t.name, time.Since(started).Round(time.Second))
				tables = append(tables, t)
			}
		}
		if _, err := tables[0].db.Pool.Exec(context.Background(), `CHECKPOINT`); err != nil {
			b.Fatal(err)
		}
		// One claim fewer than the due rows fill (a claim takes an even part
		// of every tenant's due rows, so the last one can come short), the
		// last of them under EXPLAIN for its buffers.
		for i := range due/batch - 2 {
			order := slices.Clone(tables)
			if i%2 == 1 {
				slices.Reverse(order)
			}
			for _, t := range order {
				rows, wall, cpu := claimOnce(b, t.db, t.lay, now, batch)
				if rows < batch*9/10 {
					b.Fatalf("%s: claimed %d of %d", t.name, rows, batch)
				}
				t.wall = append(t.wall, float64(rows)/wall.Seconds())
				t.cpu = append(t.cpu, float64(rows)/cpu.Seconds())
			}
		}
		for _, t := range tables {
			t.plan = explainClaim(b, t.db, t.lay, now, batch)
		}
		var sb strings.Builder
		fmt.Fprintf(&sb, "\nspread claim, %d claims of %d of the %d due rows: rows/s median (min–max)\n", due/batch-2, batch, due)
		for i, t := range tables {
			ctl := tables[i-i%2] // each layout's control precedes its big table
			r := max(t.plan.Rows, 1)
			fmt.Fprintf(&sb, "%-18s wall %6.0f (%.0f–%.0f), %.2f× its control | backend CPU %6.0f (%.0f–%.0f), %.2f× its control"+
				" | one more claim's shared buffers per row: hit %.1f, read %.1f, dirtied %.1f\n",
				t.name, median(t.wall), slices.Min(t.wall), slices.Max(t.wall), median(t.wall)/median(ctl.wall),
				median(t.cpu), slices.Min(t.cpu), slices.Max(t.cpu), median(t.cpu)/median(ctl.cpu),
				float64(t.plan.Hit)/r, float64(t.plan.Read)/r, float64(t.plan.Dirtied)/r)
		}
		b.Log(sb.String())
	}
}

// spreadFill fills a migrated schema with SpreadFill's rows, builds the
// layout from them and analyzes its tables.
func spreadFill(tb testing.TB, db *testenv.DB, lay layout, size, due int, now time.Time) {
	ctx := context.Background()
	if !lay.release { // no mirror to copy the fill (build drops it anyway)
		if _, err := db.Pool.Exec(ctx, lay.layoutSQL("DropMirror")); err != nil {
			tb.Fatalf("DropMirror: %v", err)
		}
	}
	if _, err := db.Pool.Exec(ctx, layoutNarrow.layoutSQL("SpreadFill"), pgx.NamedArgs{"size": size, "due": due, "now": now}); err != nil {
		tb.Fatalf("SpreadFill: %v", err)
	}
	lay.build(tb, db)
	for _, t := range []string{lay.hot, lay.cold} {
		if t == "" {
			continue
		}
		// as nudge-bench's scale tables: vacuumed and analyzed once, no
		// autovacuum of the whole table during the claims
		if _, err := db.Pool.Exec(ctx, `ALTER TABLE `+t+` SET (autovacuum_enabled = false)`); err != nil {
			tb.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `VACUUM ANALYZE `+t); err != nil {
			tb.Fatal(err)
		}
	}
}

// claimOnce runs the layout's ClaimDue once, as the dispatcher does (one
// transaction, the cutoff at build time), and returns the rows it claimed,
// its wall time and its backend's CPU time.
func claimOnce(tb testing.TB, db *testenv.DB, lay layout, cutoff time.Time, limit int) (int, time.Duration, time.Duration) {
	ctx := context.Background()
	conn, pid := backend(tb, db)
	defer conn.Release()
	now := time.Now()
	n := 0
	cpu0, started := onCPU(pid), time.Now()
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, lay.sql("ClaimDue"), pgx.NamedArgs{"now": now, "cutoff": cutoff, "limit": limit,
			"lease_until": now.Add(2 * time.Minute), "actor": "d"})
		if err != nil {
			return err
		}
		for rows.Next() {
			n++
		}
		return rows.Err()
	})
	wall, cpu := time.Since(started), time.Duration(onCPU(pid)-cpu0)
	if err != nil {
		tb.Fatalf("ClaimDue: %v", err)
	}
	return n, wall, cpu
}

// explainClaim runs the layout's ClaimDue once under EXPLAIN (ANALYZE,
// BUFFERS) and returns its plan's top node (its rows: the rows claimed).
func explainClaim(tb testing.TB, db *testenv.DB, lay layout, cutoff time.Time, limit int) planNode {
	ctx := context.Background()
	now := time.Now()
	var raw []byte
	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+lay.sql("ClaimDue"), pgx.NamedArgs{"now": now,
			"cutoff": cutoff, "limit": limit, "lease_until": now.Add(2 * time.Minute), "actor": "d"}).Scan(&raw)
	})
	if err != nil {
		tb.Fatalf("EXPLAIN ClaimDue: %v", err)
	}
	var out []explained
	if err := json.Unmarshal(raw, &out); err != nil {
		tb.Fatal(err)
	}
	return out[0].Plan
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// The layouts' statements are today's (schema version 31's), moved: from the
// same reminders they return the same columns and leave every reminder in
// the same state, fence, attempt count and happy-path slots, with the same
// attempts and events. A bench that measured statements doing less would
// say nothing. So do this release's statements (queries.sql, on the real
// reminder_state with its mirror), whose dispatcher's claim returns no
// idempotency key.
func TestLayoutsRunTodaysStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type outcome struct {
		columns map[string][]string
		rows    []string
		events  int
	}
	run := func(t *testing.T, lay layout) outcome {
		db := testenv.PostgresBeforeRollout(t)
		scheduleDue(t, db, 1000)
		lay.build(t, db)
		o := outcome{columns: map[string][]string{}}
		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		for _, name := range []string{"ClaimDue", "ClaimForDelivery", "RecordOutcomes"} {
			sql, _, err := pgx.NamedArgs{}.RewriteQuery(ctx, conn.Conn(), lay.sql(name), nil)
			require.NoError(t, err)
			sd, err := conn.Conn().Prepare(ctx, "", sql)
			require.NoError(t, err, name)
			for _, f := range sd.Fields {
				o.columns[name] = append(o.columns[name], fmt.Sprintf("%s %d", f.Name, f.DataTypeOID))
			}
		}
		hotPath(t, db, lay, 2)
		rows, err := db.Pool.Query(ctx, `SELECT concat_ws(' ', r.id, r.state, r.fence, r.attempts, r.claimed_fence,
			r.started_fence, r.claimed_by, r.started_by, r.delivered_by, r.dispatch_batch IS NOT NULL, r.lease_until IS NULL, r.finished_at IS NOT NULL,
			(SELECT string_agg(concat_ws(' ', a.attempt, a.fence, a.outcome, a.result), ',') FROM delivery_attempts a
			  WHERE a.reminder_id = r.id)) FROM `+lay.hot+` r ORDER BY r.id`)
		require.NoError(t, err)
		o.rows, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_events`).Scan(&o.events))
		return o
	}
	want := run(t, layoutToday)
	require.Contains(t, want.rows[0], "delivered", "today's run delivered nothing: the comparison would be empty")
	for _, lay := range []layout{layoutNarrow, layoutNarrowOnly, layoutSplit} {
		t.Run(lay.name, func(t *testing.T) {
			t.Parallel()
			got := run(t, lay)
			require.Equal(t, want.columns, got.columns, "returned columns")
			require.Equal(t, want.rows, got.rows, "reminders and attempts after two claims of 500")
			require.Equal(t, want.events, got.events, "events")
		})
	}
	t.Run(layoutRelease.name, func(t *testing.T) {
		t.Parallel()
		got := run(t, layoutRelease)
		columns := maps.Clone(want.columns)
		columns["ClaimDue"] = slices.DeleteFunc(slices.Clone(columns["ClaimDue"]),
			func(c string) bool { return strings.HasPrefix(c, "idempotency_key ") })
		require.Len(t, columns["ClaimDue"], len(want.columns["ClaimDue"])-1)
		// ClaimForDelivery's claims come as one more row of arrays, not as
		// three columns of each named row (queries.sql: the answer).
		cfd := want.columns["ClaimForDelivery"]
		require.Equal(t, []string{"fence 20", "attempts 23", "id 20"}, cfd[len(cfd)-3:])
		columns["ClaimForDelivery"] = append(slices.Clone(cfd[:len(cfd)-3]),
			"int8 1016", "int8 1016", "int4 1007", "int8 1016", "int8 1016")
		require.Equal(t, columns, got.columns, "returned columns")
		require.Equal(t, want.rows, got.rows, "reminders and attempts after two claims of 500")
		require.Equal(t, want.events, got.events, "events")
	})
}
