package main

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/store"
)

// The scrape benchmark asks whether the reconciler's own periodic costs, a
// metrics scrape of the DB collector and a repair pass, stay the same when
// the table holds millions of reminders scheduled for later (issue 18): a
// SaaS that schedules months ahead holds them, and neither the scrape nor
// the pass has any work to do for them. Each size gets a schema of its own,
// every row pending (ScrapeFill): the same small backlog due in the last
// hour, the rest due from tomorrow on; then scrapes and passes are timed,
// alternating, so both see the same moments of a busy machine.

// scrapeBacklog is the due rows of every scrape table (twice this, see
// ScrapeFill): the same backlog at every size.
const scrapeBacklog = 500

// scrapeTimes is the number of scrapes and of passes timed per table.
const scrapeTimes = 20

type scrapeResult struct {
	Size       int
	TotalBytes int64
	Load       time.Duration
	Index      time.Duration
	ScrapeMs   []float64 // one Gather of a registry holding only the DB collector
	PassMs     []float64 // the three statements of a reconciler pass that finds nothing owed
	// CountMs is the count of every open row by channel and state, as a
	// scrape made it before migration 0023: the cost that grew with the table.
	CountMs []float64
}

// scrapeRun builds a table of size future reminders (and the backlog) and
// times scrapeTimes scrapes and passes on it.
func scrapeRun(ctx context.Context, e *env, size, batch int) (res scrapeResult, err error) {
	res.Size = size
	t, err := buildScaleTable(ctx, e, "ScrapeFill", size, scrapeBacklog)
	if err != nil {
		return res, err
	}
	defer t.close()
	res.TotalBytes, res.Load, res.Index = t.totalBytes, t.load, t.index
	reg := prometheus.NewRegistry()
	c := metrics.NewDBCollector(t.pool, clock.Real{})
	c.Timeout = time.Minute // measured, not cut short
	if err := reg.Register(c); err != nil {
		return res, fmt.Errorf("scrape: %w", err)
	}
	st := store.New(t.pool)
	for range scrapeTimes {
		s0 := time.Now()
		fams, err := reg.Gather()
		if err != nil {
			return res, fmt.Errorf("scrape: gathering: %w", err)
		}
		res.ScrapeMs = append(res.ScrapeMs, millis(time.Since(s0)))
		if ok := scrapeSucceeded(fams); !ok {
			return res, fmt.Errorf("scrape: nudge_db_scrape_success is not 1")
		}
		p0 := time.Now()
		if err := passStatements(ctx, st, batch); err != nil {
			return res, err
		}
		res.PassMs = append(res.PassMs, millis(time.Since(p0)))
	}
	for range 3 {
		c0 := time.Now()
		if _, err := t.pool.Exec(ctx, stmt("CountEveryOpenRow")); err != nil {
			return res, fmt.Errorf("scrape: counting every open row: %w", err)
		}
		res.CountMs = append(res.CountMs, millis(time.Since(c0)))
	}
	return res, nil
}

// passStatements runs once each statement of reconcile.Reconciler's pass
// (expire, resolve leases, reclaim), as a pass that finds nothing owed
// does: the broker-side part of a pass is not the table's cost.
func passStatements(ctx context.Context, st *store.Store, batch int) error {
	now := time.Now()
	if _, err := st.ExpireOverdueByChannel(ctx, now, batch, "bench-scrape"); err != nil {
		return fmt.Errorf("scrape: %w", err)
	}
	if _, _, err := st.ResolveExpiredLeases(ctx, now, batch, "bench-scrape"); err != nil {
		return fmt.Errorf("scrape: %w", err)
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

func scrapeSucceeded(fams []*dto.MetricFamily) bool {
	for _, f := range fams {
		if f.GetName() == "nudge_db_scrape_success" {
			return len(f.GetMetric()) == 1 && f.GetMetric()[0].GetGauge().GetValue() == 1
		}
	}
	return false
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
