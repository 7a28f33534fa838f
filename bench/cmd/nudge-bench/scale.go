package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/store"
)

// The scale benchmark asks whether the dispatcher's claim costs the same
// whatever the size of the reminders table: the claim should walk only the
// due, pending rows (partial indexes of pending rows), so a table of ten
// million rows, terminal or due later, should claim as fast as one of ten
// thousand. Every table holds the same due rows on top of its size, so the
// claims do the same work and only what surrounds them grows. Each size
// gets a freshly migrated schema of its own, filled with INSERT … SELECT
// generate_series (secondary indexes built after the load, as a restore
// would), and is dropped before the next one is built: at most one big
// table exists at a time. Beside it lives a fresh
// control table of the smallest size, claimed from alternately with it
// batch by batch, so that each size is compared with claims taken within
// milliseconds of its own on a machine whose load moves all the time.

// scaleResult is one table size and its control: the claim rate of each run
// and the time of every claim statement, for each layout of the due rows.
type scaleResult struct {
	Size, ControlSize int
	Due               int   // pending rows due when the runs started (both sets)
	TotalBytes        int64 // with indexes and TOAST
	Load              time.Duration
	Index             time.Duration // building the indexes, ANALYZE, CHECKPOINT
	// Clustered: due rows with consecutive ids; Spread: due rows spread over
	// the whole table (see ScaleFill). The Control ones are the same runs on
	// the control table.
	Clustered, Spread, ControlClustered, ControlSpread scaleLayout
	// Plan and ControlPlan are what the planner makes of the claim on each
	// table before the runs.
	Plan, ControlPlan claimPlan
	// Promotion and ControlPromotion are the promoter's passes on each
	// table before the scrapes and the claims (promoteTables).
	Promotion, ControlPromotion promotion
}

// claimPlan is the planner's view of one claim: its cost estimate, and
// whether PostgreSQL compiles it with JIT (a cost above jit_above_cost), with
// inlining and optimization (above their own thresholds) — a compile that
// costs tens to hundreds of milliseconds on every execution.
type claimPlan struct {
	Cost                  float64
	JIT, Inline, Optimize bool
}

type scaleLayout struct {
	Rates   []float64 // claimed rows/s, one per run
	Rows    []int     // claimed rows, one per run
	Spent   []float64 // seconds of ClaimDue statements, one per run
	BatchMs []float64 // every ClaimDue statement, ms
	// Promoted is the set's promoter work (promotion.share): the state
	// rows inserted, and the wall and backend CPU seconds of the passes
	// that read its reminders, the re-scan included.
	Promoted promoterShare
}

// promoteClaimRates are the runs' rates with the promotion counted: each
// run's rows over its claims' time plus its rows' share of the promotion.
func (l scaleLayout) promoteClaimRates() []float64 {
	var out []float64
	if l.Promoted.Rows == 0 {
		return out
	}
	perRow := l.Promoted.Sec / float64(l.Promoted.Rows)
	for i, n := range l.Rows {
		out = append(out, float64(n)/(l.Spent[i]+float64(n)*perRow))
	}
	return out
}

// scaleLoadChunk is the rows of one ScaleFill statement; two load at once.
// The first chunk, loaded alone (see fillScaleTable), is scaleFirstChunk
// rows: while it loads, one of the two cores waits.
const (
	scaleLoadChunk  = 500_000
	scaleFirstChunk = 50_000
)

// tableRun builds, for one size, a control table of controlSize rows and
// one of size rows (the smallest size is compared with a control of its own
// size), each with two sets of runs×perRun due rows on top (ScaleFill), and
// measures on the pair what the sections asked for, in this order: the
// scrape section's scrapes and passes (before any claim, so that nothing is
// in flight), then the scale section's claims, perRun rows per run from each
// in turn with store.ClaimDue (the dispatcher's statement, one transaction
// per batch of `batch`): first runs over the clustered sets (they are due
// earlier), then over the spread ones. Both schemas are dropped on return:
// the scale and scrape sections share every table (build once, measure
// both, drop once).
func tableRun(ctx context.Context, e *env, o options, st statements, size, controlSize int, scale, scrape bool) (sc *scaleResult, sr *scrapeResult, built time.Duration, err error) {
	started := time.Now()
	due := o.runs * o.scalePerRun
	ctl, err := buildScaleTable(ctx, e, "ScaleFill", controlSize, due)
	if err != nil {
		return nil, nil, 0, err
	}
	defer ctl.close()
	big, err := buildScaleTable(ctx, e, "ScaleFill", size, due)
	if err != nil {
		return nil, nil, 0, err
	}
	defer big.close()
	built = time.Since(started)
	t0 := time.Now()
	promos, err := promoteTables(ctx, []*scaleTable{ctl, big})
	e.measuredSince(t0)
	if err != nil {
		return nil, nil, built, err
	}
	for _, t := range []*scaleTable{ctl, big} {
		// As autovacuum would after 2 × due inserts: a reminder_state
		// analyzed empty (the build's ANALYZE) planned the claim elsewhere.
		if _, err := t.pool.Exec(ctx, "ANALYZE reminder_state"); err != nil {
			return nil, nil, built, fmt.Errorf("scale: analyzing the state rows: %w", err)
		}
	}
	if scrape {
		t0 := time.Now()
		r, err := scrapeRun(ctx, st, ctl, big, size, o.batch)
		e.measuredSince(t0)
		if err != nil {
			return nil, nil, built, err
		}
		sr = &r
	}
	if !scale {
		return nil, sr, built, nil
	}
	t0 = time.Now()
	defer e.measuredSince(t0)
	res := scaleResult{Size: size, ControlSize: controlSize, ControlPromotion: promos[0], Promotion: promos[1]}
	res.ControlClustered.Promoted, res.ControlSpread.Promoted = promos[0].share(ctl.perSet, 0), promos[0].share(ctl.perSet, 1)
	res.Clustered.Promoted, res.Spread.Promoted = promos[1].share(big.perSet, 0), promos[1].share(big.perSet, 1)
	res.Due, res.TotalBytes, res.Load, res.Index = big.due, big.totalBytes, big.load, big.index
	if res.ControlPlan, err = ctl.explainClaim(ctx, st.claim, o.batch); err != nil {
		return nil, sr, built, err
	}
	if res.Plan, err = big.explainClaim(ctx, st.claim, o.batch); err != nil {
		return nil, sr, built, err
	}
	for _, l := range []struct{ ctl, big *scaleLayout }{
		{&res.ControlClustered, &res.Clustered}, {&res.ControlSpread, &res.Spread},
	} {
		for range o.runs {
			if err := claimAlternately(ctx, o.scalePerRun, o.batch, []*scaleTable{ctl, big}, []*scaleLayout{l.ctl, l.big}); err != nil {
				return nil, sr, built, err
			}
		}
	}
	return &res, sr, built, nil
}

// scaleTable is one built table in a schema of its own.
type scaleTable struct {
	pool        *pgxpool.Pool
	drop        func()
	now         time.Time // the claims' cutoff
	perSet      int       // due rows in each set
	due         int       // both sets
	totalBytes  int64
	load, index time.Duration
}

// scaleSchemaPrefix names the scale tables' schemas; a run drops the
// ones a killed run left (LeftoverScaleSchemas matches it).
var scaleSchemaPrefix = "bench_scale"

// buildScaleTable migrates a new schema and fills its reminders table with
// size rows terminal or due later and two sets of `due` rows due, with the
// statement named fill (ScaleFill).
func buildScaleTable(ctx context.Context, e *env, fill string, size, due int) (_ *scaleTable, err error) {
	name, drop, err := e.newSchema(ctx, scaleSchemaPrefix)
	if err != nil {
		return nil, err
	}
	t := &scaleTable{drop: drop, now: time.Now(), perSet: due}
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	cfg, err := pgxpool.ParseConfig(e.schemaURL(name))
	if err != nil {
		return t, fmt.Errorf("scale: %w", err)
	}
	cfg.MaxConns = 4
	if t.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return t, fmt.Errorf("scale: connecting to %s: %w", name, err)
	}
	if _, err := migrate(ctx, t.pool); err != nil {
		return t, fmt.Errorf("scale: migrating %s: %w", name, err)
	}
	total := size + 2*due
	if t.load, t.index, err = fillScaleTable(ctx, t.pool, fill, total, due, t.now); err != nil {
		return t, err
	}
	var rows, eager, states int64
	if err := t.pool.QueryRow(ctx, stmt("ScaleShape"), pgx.NamedArgs{"now": t.now}).
		Scan(&rows, &t.due, &eager, &states, &t.totalBytes); err != nil {
		return t, fmt.Errorf("scale: reading the table's shape: %w", err)
	}
	if rows != int64(total) || t.due != 2*due || eager != 0 || states != 0 {
		return t, fmt.Errorf("scale: built %d rows with %d due, %d not lazy and %d state rows; want %d with %d, all lazy, none",
			rows, t.due, eager, states, total, 2*due)
	}
	return t, nil
}

func (t *scaleTable) close() {
	if t.pool != nil {
		t.pool.Close()
	}
	t.drop()
}

// explainClaim asks the planner for the claim statement's plan on this
// table, without running it.
func (t *scaleTable) explainClaim(ctx context.Context, claimSQL string, batch int) (claimPlan, error) {
	var out claimPlan
	var js string
	now := time.Now()
	if err := t.pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+claimSQL, pgx.NamedArgs{
		"now": now, "cutoff": t.now, "limit": batch, "lease_until": now.Add(2 * time.Minute), "actor": "bench-scale",
	}).Scan(&js); err != nil {
		return out, fmt.Errorf("scale: explaining the claim: %w", err)
	}
	var plans []struct {
		Plan struct {
			TotalCost float64 `json:"Total Cost"`
		}
		JIT *struct {
			Options struct{ Inlining, Optimization bool }
		}
	}
	if err := json.Unmarshal([]byte(js), &plans); err != nil || len(plans) != 1 {
		return out, fmt.Errorf("scale: reading the claim's plan: %v", err)
	}
	out.Cost = plans[0].Plan.TotalCost
	if j := plans[0].JIT; j != nil {
		out.JIT, out.Inline, out.Optimize = true, j.Options.Inlining, j.Options.Optimization
	}
	return out, nil
}

// inTurn is which of n tables goes k-th at turn: in order on even turns,
// reversed on odd ones (control, table, table, control, …), so both see
// the same moments of a busy machine.
func inTurn(turn, k, n int) int {
	if turn%2 == 1 {
		return n - 1 - k
	}
	return k
}

// claimAlternately claims perRun rows from each table, one batch from each
// in turn (the first table first on even batches, the other on odd ones), so
// that both see the same moments of a busy machine; it records each
// table's rate over its own statements' time, and every statement's time.
// The claim takes rows in due order (per tenant: an even part of each batch
// from every tenant), so a table's clustered set, due first, is taken before
// its spread one; the batch at the boundary can mix the two.
func claimAlternately(ctx context.Context, perRun, batch int, tables []*scaleTable, into []*scaleLayout) error {
	claimed := make([]int, len(tables))
	spent := make([]time.Duration, len(tables))
	for turn := 0; ; turn++ {
		busy := false
		for k := range tables {
			i := inTurn(turn, k, len(tables))
			t := tables[i]
			if claimed[i] >= perRun {
				continue
			}
			busy = true
			b0 := time.Now()
			c, err := store.New(t.pool).ClaimDue(ctx, b0, t.now, min(batch, perRun-claimed[i]), 2*time.Minute, "bench-scale")
			d := time.Since(b0)
			if err != nil {
				return fmt.Errorf("scale: %w", err)
			}
			if len(c) == 0 {
				return fmt.Errorf("scale: nothing left to claim after %d rows", claimed[i])
			}
			into[i].BatchMs = append(into[i].BatchMs, float64(d.Microseconds())/1000)
			claimed[i] += len(c)
			spent[i] += d
		}
		if !busy {
			break
		}
	}
	for i := range tables {
		into[i].Rates = append(into[i].Rates, float64(claimed[i])/spent[i].Seconds())
		into[i].Rows = append(into[i].Rows, claimed[i])
		into[i].Spent = append(into[i].Spent, spent[i].Seconds())
	}
	return nil
}

// fillScaleTable loads total rows, two sets of `due` of them due, with the
// statement named fill, into the
// migrated reminders table the way a restore would: the secondary indexes and unique constraints are dropped,
// the rows inserted by two sessions at once, then the same definitions are
// rebuilt (two at a time), the table analyzed (as autovacuum would after a
// bulk load) and a checkpoint taken, so the claims do not meet one. Autovacuum
// is off for the table, so a vacuum of gigabytes cannot start mid-measurement.
func fillScaleTable(ctx context.Context, pool *pgxpool.Pool, fill string, total, due int, now time.Time) (load, index time.Duration, err error) {
	deferred, err := scaleDeferredIndexes(ctx, pool)
	if err != nil {
		return 0, 0, err
	}
	setup := []string{"ALTER TABLE reminders SET (autovacuum_enabled = false)",
		"ALTER TABLE reminder_state SET (autovacuum_enabled = false)"}
	for _, d := range deferred {
		setup = append(setup, d.drop)
	}
	for _, q := range setup {
		if _, err := pool.Exec(ctx, q); err != nil {
			return 0, 0, fmt.Errorf("scale: %s: %w", q, err)
		}
	}

	started := time.Now()
	block := max(1, total/2-due/2) // the clustered set, in the middle of the table
	var fills []func(*pgxpool.Conn) error
	for first, size := 1, scaleFirstChunk; first <= total; first, size = first+size, scaleLoadChunk {
		last := min(first+size-1, total)
		args := pgx.NamedArgs{"first": first, "last": last, "size": total, "due": due, "block": block, "now": now}
		fills = append(fills, func(c *pgxpool.Conn) error {
			if _, err := c.Exec(ctx, stmt(fill), args); err != nil {
				return fmt.Errorf("scale: loading rows %d..%d: %w", first, last, err)
			}
			return nil
		})
	}
	// A partial index that no loaded row enters (the in-flight and terminal
	// ones, when every row is pending) costs the load only its predicate
	// per row, but built afterwards it costs a scan of the whole heap
	// (seconds each at 10M rows). So the first chunk is loaded alone, and
	// the partial indexes it left empty are built on it and kept during the
	// rest of the load; a later row that does enter one is simply indexed.
	var rebuild []deferredIndex
	if len(fills) > 1 {
		if err := inParallel(ctx, pool, 1, fills[:1]); err != nil {
			return 0, 0, err
		}
		fills = fills[1:]
		for _, d := range deferred {
			empty := false
			if d.where != "" {
				if err := pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT 1 FROM "+d.table+" WHERE "+d.where+")").Scan(&empty); err != nil {
					return 0, 0, fmt.Errorf("scale: is %q empty: %w", d.where, err)
				}
			}
			if !empty {
				rebuild = append(rebuild, d)
				continue
			}
			if _, err := pool.Exec(ctx, d.build); err != nil {
				return 0, 0, fmt.Errorf("scale: %s: %w", d.build, err)
			}
		}
	} else {
		rebuild = deferred
	}
	if err := inParallel(ctx, pool, 2, fills); err != nil {
		return 0, 0, err
	}
	load = time.Since(started)

	started = time.Now()
	var builds []func(*pgxpool.Conn) error
	for _, d := range buildOrder(rebuild) {
		q := d.build
		builds = append(builds, func(c *pgxpool.Conn) error {
			b0 := time.Now()
			if _, err := c.Exec(ctx, q); err != nil {
				return fmt.Errorf("scale: %s: %w", q, err)
			}
			if total >= 1_000_000 {
				fmt.Printf("    %s: %s\n", time.Since(b0).Round(100*time.Millisecond), q[:min(len(q), 70)])
			}
			return nil
		})
	}
	if err := inParallel(ctx, pool, 2, builds, "SET maintenance_work_mem = '1GB'"); err != nil {
		return load, 0, err
	}
	// VACUUM, as autovacuum does after a bulk insert (an insert-driven
	// vacuum), so the promoter's scan of reminders_due_order is index-only
	// as on a table whose reminders were written days ago; reminder_state
	// is empty until the promotion (tableRun analyzes it after).
	v0 := time.Now()
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) reminders"); err != nil {
		return load, 0, fmt.Errorf("scale: vacuuming: %w", err)
	}
	if total >= 1_000_000 {
		fmt.Printf("    %s: VACUUM (ANALYZE) reminders\n", time.Since(v0).Round(100*time.Millisecond))
	}
	// Best effort: CHECKPOINT needs a superuser or pg_checkpoint.
	c0 := time.Now()
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Printf("  (no checkpoint after the load: %v)\n", err)
	}
	if total >= 1_000_000 {
		fmt.Printf("    %s: CHECKPOINT (indexes, ANALYZE and CHECKPOINT %s)\n", time.Since(c0).Round(100*time.Millisecond), time.Since(started).Round(time.Second))
	}
	return load, time.Since(started), nil
}

// deferredIndex is a unique constraint or secondary index of reminders or
// reminder_state that the load drops and rebuilds: drop and build are its
// statements, where the predicate of a partial index ("" otherwise), table
// the table it indexes.
type deferredIndex struct {
	drop, build, where, table string
	collated                  int // key columns compared under a collation
}

// buildOrder is the order in which the two build sessions take the
// indexes: the most key columns compared under a collation first (stable
// otherwise). Their sorts cost the most by far (at 10M rows, 54–67 s for
// (tenant, key) and (tenant, due_at, id), 33–49 s for (tenant, key
// text_pattern_ops), 12–26 s for a timestamp's; load 4–12), and a session
// that takes one last leaves the other idle meanwhile: in list order the two
// sessions ended 28–42 s apart.
func buildOrder(xs []deferredIndex) []deferredIndex {
	out := slices.Clone(xs)
	slices.SortStableFunc(out, func(a, b deferredIndex) int { return cmp.Compare(b.collated, a.collated) })
	return out
}

// scaleDeferredIndexes returns the unique constraints and secondary
// indexes of reminders and reminder_state.
func scaleDeferredIndexes(ctx context.Context, pool *pgxpool.Pool) ([]deferredIndex, error) {
	type def struct {
		name, def, table string
		where            *string
		collated         int
	}
	list := func(query string) ([]def, error) {
		rows, err := pool.Query(ctx, stmt(query))
		if err != nil {
			return nil, fmt.Errorf("scale: %s: %w", query, err)
		}
		out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (def, error) {
			var d def
			err := r.Scan(&d.name, &d.def, &d.where, &d.table, &d.collated)
			return d, err
		})
		if err != nil {
			return nil, fmt.Errorf("scale: %s: %w", query, err)
		}
		return out, nil
	}
	cons, err := list("ScaleUniqueConstraints")
	if err != nil {
		return nil, err
	}
	var out []deferredIndex
	for _, c := range cons {
		id := pgx.Identifier{c.name}.Sanitize()
		out = append(out, deferredIndex{drop: "ALTER TABLE reminders DROP CONSTRAINT " + id, build: "ALTER TABLE reminders ADD CONSTRAINT " + id + " " + c.def, table: c.table, collated: c.collated})
	}
	idx, err := list("ScaleSecondaryIndexes")
	if err != nil {
		return nil, err
	}
	for _, d := range idx {
		x := deferredIndex{drop: "DROP INDEX " + d.name, build: d.def, table: d.table, collated: d.collated} // regclass text: quoted where needed
		if d.where != nil {
			x.where = *d.where
		}
		out = append(out, x)
	}
	return out, nil
}

// inParallel runs the jobs over `width` connections of pool, each first
// running setup, and returns the first error (the others stop taking jobs).
func inParallel(ctx context.Context, pool *pgxpool.Pool, width int, jobs []func(*pgxpool.Conn) error, setup ...string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan func(*pgxpool.Conn) error)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
			cancel()
		}
	}
	for range width {
		wg.Go(func() {
			c, err := pool.Acquire(ctx)
			if err != nil {
				fail(fmt.Errorf("acquiring a connection: %w", err))
				return
			}
			defer c.Release()
			for _, q := range setup {
				if _, err := c.Exec(ctx, q); err != nil {
					fail(fmt.Errorf("%s: %w", q, err))
					return
				}
			}
			for job := range next {
				if err := job(c); err != nil {
					fail(err)
					return
				}
			}
		})
	}
feed:
	for _, job := range jobs {
		select {
		case next <- job:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}

// dropLeftoverScaleSchemas drops scale schemas a killed run left behind
// (an interrupted run drops its own): each can hold gigabytes.
func dropLeftoverScaleSchemas(ctx context.Context, e *env) error {
	rows, err := e.admin.Query(ctx, stmt("LeftoverScaleSchemas"))
	if err != nil {
		return fmt.Errorf("listing leftover scale schemas: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("listing leftover scale schemas: %w", err)
	}
	for _, n := range names {
		fmt.Printf("  dropping %s, left behind by an earlier run\n", n)
		e.dropSchema(n)
	}
	return nil
}
