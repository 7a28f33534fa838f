package store

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// planNode is the part of EXPLAIN (FORMAT JSON) a cost report reads.
type planNode struct {
	NodeType   string     `json:"Node Type"`
	Relation   string     `json:"Relation Name"`
	Total      float64    `json:"Actual Total Time"`
	WALRecords int64      `json:"WAL Records"`
	WALFPI     int64      `json:"WAL FPI"`
	WALBytes   int64      `json:"WAL Bytes"`
	Hit        int64      `json:"Shared Hit Blocks"`
	Dirtied    int64      `json:"Shared Dirtied Blocks"`
	Read       int64      `json:"Shared Read Blocks"`
	Plans      []planNode `json:"Plans"`
	Index      string     `json:"Index Name"`
	Sub        string     `json:"Subplan Name"`
	Rows       float64    `json:"Actual Rows"`
	Loops      float64    `json:"Actual Loops"`
	Est        float64    `json:"Plan Rows"`
}

func textPlan(sb *strings.Builder, n planNode, depth int) {
	fmt.Fprintf(sb, "%s%s %s %s %s est=%.0f rows=%.0f loops=%.0f total=%.2fms hit=%d\n", strings.Repeat("  ", depth),
		n.NodeType, n.Relation, n.Index, n.Sub, n.Est, n.Rows, n.Loops, n.Total, n.Hit)
	for _, p := range n.Plans {
		textPlan(sb, p, depth+1)
	}
}

type explained struct {
	Plan planNode `json:"Plan"`
	Exec float64  `json:"Execution Time"`
	// Planning is the time spent planning, which EXPLAIN does on every run
	// (a worker's prepared statement is planned once, or a few times).
	Planning float64 `json:"Planning Time"`
}

// cost is one statement's server-side cost, summed over its runs.
type cost struct {
	runs, rows             int
	execMs                 float64
	walRecords, walBytes   int64
	walFPI, hit, dirtied   int64
	cpuNS                  int64 // the backend's on-CPU time (schedstat)
	planMs                 float64
	generic, custom        int64              // plans of the last connection's prepared statement (NUDGE_BENCH_EXEC=prepared)
	writes                 map[string]float64 // ms per written relation
	writeRecs, writeBytesM map[string]int64
}

// modify sums the WAL of the plan's ModifyTable nodes: a data-modifying CTE
// runs outside the top node, so the top node's totals miss it; no
// ModifyTable sits inside another's subtree, so the sum counts each once.
func (c *cost) modify(n planNode) {
	if n.NodeType == "ModifyTable" {
		c.walRecords += n.WALRecords
		c.walBytes += n.WALBytes
		c.walFPI += n.WALFPI
		c.writes[n.Relation] += n.Total
		c.writeRecs[n.Relation] += n.WALRecords
	}
	for _, p := range n.Plans {
		c.modify(p)
	}
}

type costs struct {
	by   map[string]*cost
	xids map[int64]string // transaction id → statement, for pg_waldump
	lay  layout           // whose statements run (today's: internal/store/queries.sql)
}

// onCPU is the time process pid has spent on a CPU, from
// /proc/PID/schedstat (nanoseconds, not clock ticks); -1 when unreadable (a
// server on another host).
func onCPU(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// backend acquires a connection of db's pool and returns it with its
// backend's process id, for onCPU.
func backend(tb testing.TB, db *testenv.DB) (*pgxpool.Conn, int) {
	tb.Helper()
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		conn.Release()
		tb.Fatal(err)
	}
	return conn, pid
}

// explain runs the named statement under EXPLAIN (ANALYZE, BUFFERS, WAL) (it
// executes and commits) and adds its cost for rows rows, with the CPU time
// its backend spent on the transaction (NUDGE_BENCH_TIMING=off leaves out
// the per-node timing, which costs CPU of its own).
func (cs costs) explain(tb testing.TB, db *testenv.DB, name string, rows int, args pgx.NamedArgs) {
	tb.Helper()
	ctx := context.Background()
	var raw []byte
	var xid int64
	conn, pid := backend(tb, db)
	defer conn.Release()
	options := "ANALYZE, BUFFERS, WAL, FORMAT JSON"
	if os.Getenv("NUDGE_BENCH_TIMING") == "off" {
		options += ", TIMING OFF"
	}
	// NUDGE_BENCH_EXEC=prepared runs the statement itself, as the binaries
	// do (pgx's cached prepared statement, so PostgreSQL's plan cache picks
	// custom or generic plans): CPU and plan-cache counts only, no plan.
	prepared := os.Getenv("NUDGE_BENCH_EXEC") == "prepared"
	cpu0 := onCPU(pid)
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT txid_current() % 4294967296`).Scan(&xid); err != nil {
			return err
		}
		// NUDGE_BENCH_PLAN_CACHE: plan_cache_mode for the statement
		// (auto, force_custom_plan or force_generic_plan).
		if m := os.Getenv("NUDGE_BENCH_PLAN_CACHE"); m != "" {
			if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+pgx.Identifier{m}.Sanitize()); err != nil {
				return err
			}
		}
		if prepared {
			// NUDGE_BENCH_AUTOEXPLAIN=<statement>: its 40th run (a generic
			// plan by then) is logged by auto_explain with its timings and
			// buffers, in the server's log.
			if os.Getenv("NUDGE_BENCH_AUTOEXPLAIN") == name && cs.by[name] != nil && cs.by[name].runs == 39 {
				for _, q := range []string{`LOAD 'auto_explain'`, `SET LOCAL auto_explain.log_min_duration = 0`,
					`SET LOCAL auto_explain.log_analyze = on`, `SET LOCAL auto_explain.log_buffers = on`, `SET LOCAL auto_explain.log_wal = on`} {
					if _, err := tx.Exec(ctx, q); err != nil {
						return err
					}
				}
			}
			rows, err := tx.Query(ctx, cs.lay.sql(name), args)
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		}
		return tx.QueryRow(ctx, "EXPLAIN ("+options+") "+cs.lay.sql(name), args).Scan(&raw)
	})
	if err != nil {
		tb.Fatalf("%s: %v", name, err)
	}
	cpu1 := onCPU(pid)
	cs.xids[xid] = name
	c := cs.by[name]
	if c == nil {
		c = &cost{writes: map[string]float64{}, writeRecs: map[string]int64{}, writeBytesM: map[string]int64{}}
		cs.by[name] = c
	}
	first := c.runs == 0
	c.runs++
	c.rows += rows
	c.cpuNS += cpu1 - cpu0
	if prepared {
		var generic, custom int64
		q := strings.TrimSpace(cs.lay.sql(name))
		if err := conn.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)
			FROM pg_prepared_statements WHERE position($1 IN statement) > 0`, q[len(q)-30:]).Scan(&generic, &custom); err == nil {
			c.generic, c.custom = generic, custom
		}
		return
	}
	var out []explained
	if err := json.Unmarshal(raw, &out); err != nil {
		tb.Fatal(err)
	}
	if os.Getenv("NUDGE_BENCH_PLANS") != "" && first {
		var sb strings.Builder
		textPlan(&sb, out[0].Plan, 0)
		tb.Logf("%s plan (%.1f ms):\n%s", name, out[0].Exec, sb.String())
	}
	c.execMs += out[0].Exec
	c.planMs += out[0].Planning
	c.hit += out[0].Plan.Hit
	c.dirtied += out[0].Plan.Dirtied
	c.modify(out[0].Plan)
}

func (cs costs) report(tb testing.TB) {
	var names []string
	for n := range cs.by {
		names = append(names, n)
	}
	sort.Strings(names)
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%-18s %6s %9s %9s %9s %10s %9s %9s %9s %9s %7s %s\n", "statement", "rows", "ms/batch", "µs/row",
		"CPUµs/row", "planµs/row", "hit/row", "dirt/row", "WALrec/row", "WALB/row", "FPI", "ms by written relation")
	for _, n := range names {
		c := cs.by[n]
		r := float64(max(c.rows, 1))
		var w []string
		for rel, ms := range c.writes {
			w = append(w, fmt.Sprintf("%s %.1f (%.1f rec/row)", rel, ms/float64(c.runs), float64(c.writeRecs[rel])/r))
		}
		sort.Strings(w)
		fmt.Fprintf(&sb, "%-18s %6d %9.1f %9.1f %9.1f %10.1f %9.1f %9.2f %9.1f %9.0f %7d %s\n", n, c.rows/c.runs,
			c.execMs/float64(c.runs), c.execMs*1000/r, float64(c.cpuNS)/1000/r, c.planMs*1000/r, float64(c.hit)/r,
			float64(c.dirtied)/r,
			float64(c.walRecords)/r, float64(c.walBytes)/r, c.walFPI, strings.Join(w, ", "))
	}
	for _, n := range names {
		if c := cs.by[n]; c.generic+c.custom > 0 {
			fmt.Fprintf(&sb, "%-18s prepared: %d generic and %d custom plans on the last connection\n", n, c.generic, c.custom)
		}
	}
	tb.Log(sb.String())
}

// BenchmarkStatementCosts measures, with EXPLAIN (ANALYZE, BUFFERS, WAL),
// what each statement on the hot path costs the server per reminder: the
// dispatcher's (batches of 500) and the workers' (batches of 50), over a
// fresh table of NUDGE_BENCH_N (default 20,000) due reminders in four
// tenants, left without statistics as after a bulk intake.
//
//	go test ./internal/store -run '^$' -bench StatementCosts -benchtime 1x -v
//
// EXPLAIN plans its statement on every run, and its per-node timing costs
// CPU of its own: NUDGE_BENCH_EXEC=prepared runs the statements as the
// binaries do instead (pgx's prepared statement, generic plans after five
// custom ones), for their backend CPU only; NUDGE_BENCH_PLAN_CACHE sets
// plan_cache_mode for either.
func BenchmarkStatementCosts(b *testing.B) {
	n := 20000
	if _, err := fmt.Sscan(envOr("NUDGE_BENCH_N", "20000"), &n); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		statementCosts(b, n)
	}
}

func envOr(name, def string) string {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v
	}
	return def
}

func statementCosts(b *testing.B, n int) {
	ctx := context.Background()
	db := testenv.Postgres(b)
	// NUDGE_BENCH_SQL runs on the fresh schema before the reminders are scheduled,
	// e.g. to try the statements without an index or with another fillfactor:
	// NUDGE_BENCH_SQL='DROP INDEX reminders_parked'.
	if q := os.Getenv("NUDGE_BENCH_SQL"); q != "" {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			b.Fatalf("NUDGE_BENCH_SQL: %v", err)
		}
	}
	scheduleDue(b, db, n)
	// NUDGE_BENCH_WINDOW sets an SMS send window policy, in UTC: "open" (open
	// now: every claimed row's window is evaluated), "closed" (each claimed
	// row is moved to the next opening), or unset (the default, any time).
	switch w := os.Getenv("NUDGE_BENCH_WINDOW"); w {
	case "open", "closed":
		h := time.Now().UTC().Hour()
		open, close := (h+23)%24, (h+2)%24 // an hour ago to two hours ahead
		if w == "closed" {
			open, close = (h+3)%24, (h+5)%24
		}
		if _, err := db.Pool.Exec(ctx, `INSERT INTO nudge_send_windows (tenant, channel, window_open, window_close)
			VALUES ('*', 'sms', make_time($1, 0, 0), make_time($2, 0, 0))`, open, close); err != nil {
			b.Fatal(err)
		}
	}
	if os.Getenv("NUDGE_BENCH_ANALYZE") != "" {
		if _, err := db.Pool.Exec(ctx, `ANALYZE reminders, reminder_state`); err != nil {
			b.Fatal(err)
		}
	}
	cs, lsn0, lsn1 := hotPath(b, db, layoutRelease, benchRounds(b, n))
	cs.report(b)
	// The attempts' heap once every claimed reminder has one, written and
	// then updated with its outcome: what the table's fillfactor costs.
	var attPages, attRows int64
	if err := db.Pool.QueryRow(ctx, `SELECT pg_relation_size('delivery_attempts') / 8192, count(*) FROM delivery_attempts`).
		Scan(&attPages, &attRows); err != nil {
		b.Fatal(err)
	}
	b.Logf("delivery_attempts: %d rows in %d heap pages (%.1f rows a page)", attRows, attPages,
		float64(attRows)/float64(max(attPages, 1)))
	cs.walDump(b, lsn0, lsn1, relations(b, db))
}

// scheduleDue schedules n due SMS reminders in four tenants through the
// intake, with the payload the end-to-end bench inserts.
func scheduleDue(tb testing.TB, db *testenv.DB, n int) {
	ctx := context.Background()
	due, deadline := time.Now().Add(-time.Minute), time.Now().Add(2*time.Hour)
	for off := 0; off < n; off += 2000 {
		var reqs []intake.Request
		for i := off; i < min(off+2000, n); i++ {
			reqs = append(reqs, intake.Request{
				Tenant: fmt.Sprintf("tenant-%d", i%4), Key: fmt.Sprintf("bench:%d", i), Channel: reminder.SMS,
				Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
				Data: map[string]any{"course": "Go 101"}, DueAt: due, Deadline: deadline,
			})
		}
		if _, err := intake.ScheduleMany(ctx, db.Pool, reqs); err != nil {
			tb.Fatal(err)
		}
	}
}

// benchRounds is NUDGE_BENCH_ROUNDS (default 4), the 500-row claims a run
// makes out of its n due reminders.
func benchRounds(tb testing.TB, n int) int {
	rounds := 4
	if _, err := fmt.Sscan(envOr("NUDGE_BENCH_ROUNDS", "4"), &rounds); err != nil || rounds*500 > n {
		tb.Fatalf("NUDGE_BENCH_ROUNDS: %q: want a number of 500-row claims up to NUDGE_BENCH_N/500", os.Getenv("NUDGE_BENCH_ROUNDS"))
	}
	return rounds
}

// hotPath runs a delivered reminder's statements, in lay's layout, for
// rounds claims of 500 due reminders: the dispatcher's claim and its
// confirmation, then the workers' claims and outcomes in batches of 50,
// each under EXPLAIN (see explain). It returns their costs and the WAL
// positions before and after, for walDump.
func hotPath(tb testing.TB, db *testenv.DB, lay layout, rounds int) (cs costs, lsn0, lsn1 string) {
	ctx := context.Background()
	cs = costs{by: map[string]*cost{}, xids: map[int64]string{}, lay: lay}
	if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn0); err != nil {
		tb.Fatal(err)
	}
	// NUDGE_BENCH_WORKER_BATCH (default 50, the worker's envelope) sizes the
	// worker statements' batches: the CPU per batch at two sizes separates
	// what a statement costs per execution from what it costs per row.
	const dispatchBatch = 500
	workerBatch := 50
	if _, err := fmt.Sscan(envOr("NUDGE_BENCH_WORKER_BATCH", "50"), &workerBatch); err != nil || workerBatch < 1 {
		tb.Fatalf("NUDGE_BENCH_WORKER_BATCH: %q: want a positive number", os.Getenv("NUDGE_BENCH_WORKER_BATCH"))
	}
	for range rounds {
		now := time.Now()
		cs.explain(tb, db, "ClaimDue", dispatchBatch, pgx.NamedArgs{"now": now, "cutoff": now, "limit": dispatchBatch,
			"lease_until": now.Add(2 * time.Minute), "actor": "d"})
		leased := fencedIn(tb, db, lay.hot, "enqueued")
		var batch int64
		if err := db.Pool.QueryRow(ctx, `SELECT max(dispatch_batch) FROM `+lay.hot).Scan(&batch); err != nil {
			tb.Fatal(err)
		}
		cs.explain(tb, db, "ConfirmPublished", len(leased), pgx.NamedArgs{"now": now, "batches": []int64{batch},
			"confirmed": []int32{int32(len(leased))}, "actor": "d"})
		for off := 0; off < len(leased); off += workerBatch {
			batch := leased[off:min(off+workerBatch, len(leased))]
			ids, fences := split(batch)
			now := time.Now()
			cs.explain(tb, db, "ClaimForDelivery", len(batch), pgx.NamedArgs{"now": now, "channel": "sms", "ids": ids, "fences": fences,
				"lease_until": now.Add(time.Minute), "actor": "w"})
			rows, err := db.Pool.Query(ctx, `SELECT r.id, r.fence, a.id FROM `+lay.hot+` r
				JOIN delivery_attempts a ON a.reminder_id = r.id AND a.fence = r.fence
				WHERE r.id = ANY($1) AND r.state = 'sending'`, ids)
			if err != nil {
				tb.Fatal(err)
			}
			var outs []Outcome
			for rows.Next() {
				o := Outcome{Code: reminder.CodeDelivered, Attempt: reminder.OutcomeDelivered, Reason: "delivered", ProviderID: "p"}
				if err := rows.Scan(&o.ReminderID, &o.Fence, &o.AttemptID); err != nil {
					tb.Fatal(err)
				}
				outs = append(outs, o)
			}
			if rows.Err() != nil || len(outs) != len(batch) {
				tb.Fatalf("claimed %d of %d: %v", len(outs), len(batch), rows.Err())
			}
			args, err := outcomeArgs(time.Now(), outs, "w")
			if err != nil {
				tb.Fatal(err)
			}
			cs.explain(tb, db, "RecordOutcomes", len(outs), args)
		}
	}
	if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn1); err != nil {
		tb.Fatal(err)
	}
	return cs, lsn0, lsn1
}

// relations names the schema's relations by file node, for walDump.
func relations(tb testing.TB, db *testenv.DB) map[string]string {
	rels := map[string]string{}
	rows, err := db.Pool.Query(context.Background(), `SELECT pg_relation_filenode(c.oid)::text, c.relname FROM pg_class c
		WHERE c.relnamespace = current_schema()::regnamespace AND pg_relation_filenode(c.oid) <> 0`)
	if err != nil {
		tb.Fatal(err)
	}
	for rows.Next() {
		var node, name string
		if err := rows.Scan(&node, &name); err != nil {
			tb.Fatal(err)
		}
		rels[node] = name
	}
	if rows.Err() != nil {
		tb.Fatal(rows.Err())
	}
	return rels
}

// walDump reads the WAL written between from and to with pg_waldump and
// reports, per statement, the records and bytes its transactions wrote (the
// commit record included), by resource manager. It needs read access to the
// server's pg_wal (NUDGE_PG_WAL, default the Debian path); without it, it
// says so and returns.
//
// It then reports the records of each statement by relation (named by
// rels, file node → name) and kind: per delivered reminder, which indexes
// get an entry, and whether a row's update was HOT (HOT_UPDATE) or wrote a
// new tuple that every index then points to (UPDATE). It returns the same
// figures by statement (nil without pg_waldump).
func (cs costs) walDump(tb testing.TB, from, to string, rels map[string]string) map[string]*walTotals {
	dir := envOr("NUDGE_PG_WAL", "/var/lib/postgresql/15/main/pg_wal")
	bin := envOr("NUDGE_PG_WALDUMP", "/usr/lib/postgresql/15/bin/pg_waldump")
	out, err := exec.Command(bin, "-p", dir, "-s", from, "-e", to).Output()
	if err != nil && len(out) == 0 {
		tb.Logf("pg_waldump unavailable (%v): WAL by transaction not measured", err)
		return nil
	}
	type agg struct{ recs, bytes int64 }
	by := map[string]map[string]*agg{}     // statement → rmgr → totals
	byRel := map[string]map[string]int64{} // statement → "relation kind" → records
	totals := map[string]*walTotals{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		// rmgr: Heap len (rec/tot): 54/ 54, tx: 735, lsn: ...
		if len(f) < 8 || f[0] != "rmgr:" {
			continue
		}
		i := slices.Index(f, "tx:")
		if i < 0 || i+1 >= len(f) {
			continue
		}
		xid, err := strconv.ParseInt(strings.TrimSuffix(f[i+1], ","), 10, 64)
		if err != nil {
			continue
		}
		name, ok := cs.xids[xid]
		if !ok {
			continue
		}
		tot := strings.TrimSuffix(f[i-1], ",")
		if j := strings.LastIndexByte(tot, '/'); j >= 0 {
			tot = tot[j+1:]
		}
		n, _ := strconv.ParseInt(tot, 10, 64)
		if by[name] == nil {
			by[name] = map[string]*agg{}
		}
		a := by[name][f[1]]
		if a == nil {
			a = &agg{}
			by[name][f[1]] = a
		}
		a.recs++
		a.bytes += n
		if byRel[name] == nil {
			byRel[name] = map[string]int64{}
		}
		kind := walRelation(f, rels)
		byRel[name][kind]++
		t := totals[name]
		if t == nil {
			t = &walTotals{kinds: map[string]int64{}, relBytes: map[string]int64{}}
			totals[name] = t
		}
		t.recs++
		t.bytes += n
		t.kinds[kind]++
		rel, _, _ := strings.Cut(kind, " ")
		if strings.HasPrefix(kind, "rel ") {
			rel = kind[:strings.LastIndexByte(kind, ' ')]
		}
		t.relBytes[rel] += n
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nWAL per reminder from pg_waldump (the statements' own transactions)\n")
	names := slices.Sorted(maps.Keys(by))
	var total float64
	for _, name := range names {
		r := float64(cs.by[name].rows)
		var recs, bytes int64
		var parts []string
		for _, rm := range slices.Sorted(maps.Keys(by[name])) {
			a := by[name][rm]
			recs += a.recs
			bytes += a.bytes
			parts = append(parts, fmt.Sprintf("%s %.1f rec %.0f B", rm, float64(a.recs)/r, float64(a.bytes)/r))
		}
		total += float64(bytes) / r
		fmt.Fprintf(&sb, "%-18s %6.1f rec/row %7.0f B/row   %s\n", name, float64(recs)/r, float64(bytes)/r,
			strings.Join(parts, ", "))
	}
	fmt.Fprintf(&sb, "total per reminder through the pipeline: %.0f B\n", total)
	fmt.Fprintf(&sb, "\nWAL records per reminder by relation and kind\n")
	for _, name := range names {
		r := float64(cs.by[name].rows)
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(byRel[name])) {
			if v := float64(byRel[name][k]) / r; v >= 0.05 {
				parts = append(parts, fmt.Sprintf("%s %.2f", k, v))
			}
		}
		fmt.Fprintf(&sb, "%-18s %s\n", name, strings.Join(parts, ", "))
	}
	tb.Log(sb.String())
	return totals
}

// walTotals is what one statement's transactions wrote, from pg_waldump.
type walTotals struct {
	recs, bytes int64
	kinds       map[string]int64 // "relation kind" (walRelation) → records
	relBytes    map[string]int64 // relation (or resource manager) → bytes
}

// walRelation names what one pg_waldump record (its fields f) wrote: the
// relation of its first block reference (by rels, else its file node) and
// the record's kind (INSERT_LEAF, UPDATE, HOT_UPDATE, ...); records without
// a block (commits) by their resource manager.
func walRelation(f []string, rels map[string]string) string {
	kind, rel := "", ""
	for i, w := range f {
		if w == "desc:" && i+1 < len(f) {
			kind = f[i+1]
		}
		if w == "rel" && i+1 < len(f) && rel == "" {
			node := strings.TrimSuffix(f[i+1][strings.LastIndexByte(f[i+1], '/')+1:], ",")
			if rel = rels[node]; rel == "" {
				rel = "rel " + node
			}
		}
	}
	if rel == "" {
		return f[1]
	}
	return rel + " " + kind
}

func fencedIn(tb testing.TB, db *testenv.DB, table, state string) []Fenced {
	rows, err := db.Pool.Query(context.Background(), `SELECT id, fence FROM `+table+` WHERE state = $1 ORDER BY id`, state)
	if err != nil {
		tb.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Fenced, error) {
		var f Fenced
		return f, r.Scan(&f.ID, &f.Fence)
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}
