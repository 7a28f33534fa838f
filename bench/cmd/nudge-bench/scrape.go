package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/internal/store"
)

// The scrape benchmark asks whether the reconciler's own periodic costs, a
// metrics scrape of the DB collector and a repair pass, stay the same when
// the table holds millions of reminders scheduled for later (issue 18): a
// SaaS that schedules months ahead holds them, and neither the scrape nor
// the pass has any work to do for them. It runs on the scale section's
// tables (tableRun), before their claims: every row pending, the same small
// backlog due at every size, the rest due from tomorrow on. Scrapes and
// passes are timed on the table and on its control alternately, so both see
// the same moments of a busy machine and the same warm-up.

// scrapeBacklog is the due rows a scrape and a pass see: the first rows of
// the clustered set (ScaleFill), whose due times are 50 minutes over the
// set's size apart; the scrape's clock stops between the last of them and
// the next one, so the rest of both due sets is not due yet.
const scrapeBacklog = 1000

// scrapeTimes is the number of scrapes and of passes timed per table;
// scrapeWarmup more of each come first, untimed, on both tables.
const (
	scrapeTimes  = 100
	scrapeWarmup = 5
)

type scrapeResult struct {
	Size                   int
	TotalBytes             int64
	ScrapeMs, PassMs       []float64 // one Gather of a registry holding only the DB collector; the three statements of a pass that finds nothing owed
	CtlScrapeMs, CtlPassMs []float64 // the same on the control table
	// CountMs is the count of every open row by channel and state, as a
	// scrape made it before migration 0023: the cost that grew with the table.
	CountMs []float64
	// Plans are EXPLAIN (ANALYZE, BUFFERS) of each statement on the table
	// and on its control, once, after the timed runs.
	Plans, CtlPlans []stmtPlan
}

// stmtPlan is what EXPLAIN (ANALYZE, BUFFERS) says one statement cost.
type stmtPlan struct {
	Name                    string
	PlanningMs, ExecutionMs float64
	PlanHit, PlanRead       int64 // shared buffers the planner touched
	Hit, Read               int64 // shared buffers the execution touched
	Text                    string
}

// statements are the Nudge statements the scale and scrape sections run
// or explain, read from the repository (the files the packages embed).
type statements struct {
	claim                            string
	gauges, expire, resolve, reclaim string
}

func loadStatements(repo string) (statements, error) {
	read := func(file, name string) (string, error) {
		src, err := os.ReadFile(filepath.Join(repo, file))
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", file, err)
		}
		return sqlfile.Parse(filepath.Base(file), string(src)).Get(name), nil
	}
	var st statements
	for _, x := range []struct {
		into       *string
		file, name string
	}{
		{&st.claim, "internal/store/queries.sql", "ClaimDue"},
		{&st.gauges, "internal/metrics/queries.sql", "DBGauges"},
		{&st.expire, "internal/store/queries.sql", "ExpireOverdue"},
		{&st.resolve, "internal/store/queries.sql", "ResolveExpiredLeases"},
		{&st.reclaim, "internal/store/queries.sql", "Reclaim"},
	} {
		var err error
		if *x.into, err = read(x.file, x.name); err != nil {
			return st, err
		}
	}
	return st, nil
}

// scrapeAt is the scrape's clock on t: scrapeBacklog rows of its clustered
// set due, no other.
func scrapeAt(t *scaleTable) time.Time {
	step := float64(50*time.Minute) / float64(t.perSet)
	return t.now.Add(-2*time.Hour + time.Duration((float64(scrapeBacklog)-0.5)*step))
}

// scrapeRun times scrapeTimes scrapes and passes on big and on its control
// ctl, alternately, then explains each statement once on both.
func scrapeRun(ctx context.Context, st statements, ctl, big *scaleTable, size, batch int) (res scrapeResult, err error) {
	res.Size, res.TotalBytes = size, big.totalBytes
	type side struct {
		t            *scaleTable
		reg          *prometheus.Registry
		st           *store.Store
		at           time.Time
		scrape, pass *[]float64
	}
	var sides []side
	for _, x := range []struct {
		t            *scaleTable
		scrape, pass *[]float64
	}{{ctl, &res.CtlScrapeMs, &res.CtlPassMs}, {big, &res.ScrapeMs, &res.PassMs}} {
		at := scrapeAt(x.t)
		reg := prometheus.NewRegistry()
		c := metrics.NewDBCollector(x.t.pool, clock.NewFake(at))
		c.Timeout = time.Minute // measured, not cut short
		if err := reg.Register(c); err != nil {
			return res, fmt.Errorf("scrape: %w", err)
		}
		sides = append(sides, side{x.t, reg, store.New(x.t.pool), at, x.scrape, x.pass})
	}
	for i := range scrapeWarmup + scrapeTimes {
		for k := range sides {
			s := sides[k]
			if i%2 == 1 {
				s = sides[len(sides)-1-k]
			}
			s0 := time.Now()
			fams, err := s.reg.Gather()
			if err != nil {
				return res, fmt.Errorf("scrape: gathering: %w", err)
			}
			d := time.Since(s0)
			if err := scrapeChecks(fams); err != nil {
				return res, err
			}
			p0 := time.Now()
			if err := passStatements(ctx, s.st, s.at, batch); err != nil {
				return res, err
			}
			if i >= scrapeWarmup {
				*s.scrape = append(*s.scrape, millis(d))
				*s.pass = append(*s.pass, millis(time.Since(p0)))
			}
		}
	}
	for range 3 {
		c0 := time.Now()
		if _, err := big.pool.Exec(ctx, stmt("CountEveryOpenRow")); err != nil {
			return res, fmt.Errorf("scrape: counting every open row: %w", err)
		}
		res.CountMs = append(res.CountMs, millis(time.Since(c0)))
	}
	if res.CtlPlans, err = explainScrape(ctx, st, sides[0].t, sides[0].at, batch); err != nil {
		return res, err
	}
	if res.Plans, err = explainScrape(ctx, st, sides[1].t, sides[1].at, batch); err != nil {
		return res, err
	}
	return res, nil
}

// passStatements runs once each statement of reconcile.Reconciler's pass
// (expire, resolve leases, reclaim), as a pass that finds nothing owed
// does: the broker-side part of a pass is not the table's cost.
func passStatements(ctx context.Context, st *store.Store, now time.Time, batch int) error {
	exp, err := st.ExpireOverdueByChannel(ctx, now, batch, "bench-scrape")
	if err != nil {
		return fmt.Errorf("scrape: %w", err)
	}
	if len(exp) != 0 {
		return fmt.Errorf("scrape: the pass expired reminders of a table with no deadline passed: %v", exp)
	}
	if r, c, err := st.ResolveExpiredLeases(ctx, now, batch, "bench-scrape"); err != nil {
		return fmt.Errorf("scrape: %w", err)
	} else if r+c != 0 {
		return fmt.Errorf("scrape: the pass resolved %d leases of a table with none", r+c)
	}
	c, err := st.ReclaimExcept(ctx, now, 10*time.Minute, batch, 2*time.Minute, "bench-scrape", nil)
	if err != nil {
		return fmt.Errorf("scrape: %w", err)
	}
	if len(c) != 0 {
		return fmt.Errorf("scrape: the pass reclaimed %d rows of a table with nothing in flight", len(c))
	}
	return nil
}

// scrapeChecks fails unless the scrape succeeded and saw the backlog, and
// only it, as due: the same work at every size.
func scrapeChecks(fams []*dto.MetricFamily) error {
	ok, due := false, 0.0
	for _, f := range fams {
		switch f.GetName() {
		case "nudge_db_scrape_success":
			ok = len(f.GetMetric()) == 1 && f.GetMetric()[0].GetGauge().GetValue() == 1
		case "nudge_open_reminders":
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "state" && l.GetValue() == "pending" {
						due += m.GetGauge().GetValue()
					}
				}
			}
		}
	}
	if !ok {
		return fmt.Errorf("scrape: nudge_db_scrape_success is not 1")
	}
	if due != scrapeBacklog {
		return fmt.Errorf("scrape: %.0f pending reminders due, want the backlog of %d", due, scrapeBacklog)
	}
	return nil
}

// explainScrape runs EXPLAIN (ANALYZE, BUFFERS) of the scrape's statement
// and of the pass's three on t, at `at`, each in a transaction rolled back,
// and returns their costs and text plans.
func explainScrape(ctx context.Context, st statements, t *scaleTable, at time.Time, batch int) ([]stmtPlan, error) {
	noTexts, noIDs := []string{}, []int64{}
	var out []stmtPlan
	for _, x := range []struct {
		name, sql string
		args      pgx.NamedArgs
	}{
		{"scrape (DBGauges)", st.gauges, pgx.NamedArgs{"now": at, "hour_ago": at.Add(-time.Hour)}},
		{"ExpireOverdue", st.expire, pgx.NamedArgs{"now": at, "limit": batch, "actor": "bench-scrape",
			"hold_channels": noTexts, "hold_for": time.Duration(0), "looked": noIDs}},
		{"ResolveExpiredLeases", st.resolve, pgx.NamedArgs{"now": at, "limit": batch, "actor": "bench-scrape"}},
		{"Reclaim", st.reclaim, pgx.NamedArgs{"now": at, "overdue_before": at.Add(-10 * time.Minute), "limit": batch,
			"lease_until": at.Add(2 * time.Minute), "actor": "bench-scrape", "max_republishes": store.MaxRepublishes, "waiting": noTexts}},
	} {
		p, err := explainOnce(ctx, t, x.sql, x.args)
		if err != nil {
			return nil, fmt.Errorf("scrape: explaining %s: %w", x.name, err)
		}
		p.Name = x.name
		out = append(out, p)
	}
	return out, nil
}

func explainOnce(ctx context.Context, t *scaleTable, sql string, args pgx.NamedArgs) (stmtPlan, error) {
	var p stmtPlan
	tx, err := t.pool.Begin(ctx)
	if err != nil {
		return p, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var js string
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args).Scan(&js); err != nil {
		return p, err
	}
	var plans []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		}
		Planning struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		}
		PlanningTime  float64 `json:"Planning Time"`
		ExecutionTime float64 `json:"Execution Time"`
	}
	if err := json.Unmarshal([]byte(js), &plans); err != nil || len(plans) != 1 {
		return p, fmt.Errorf("reading the plan: %v", err)
	}
	x := plans[0]
	p.PlanningMs, p.ExecutionMs = x.PlanningTime, x.ExecutionTime
	p.PlanHit, p.PlanRead, p.Hit, p.Read = x.Planning.Hit, x.Planning.Read, x.Plan.Hit, x.Plan.Read
	var text []string
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args)
	if err != nil {
		return p, err
	}
	if text, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return p, err
	}
	p.Text = strings.Join(text, "\n")
	return p, nil
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
