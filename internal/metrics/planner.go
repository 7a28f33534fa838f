package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/pg"
)

// Slice outcomes, for nudge_campaign_slices_total{outcome}: what a planner
// did with one planning command (internal/campaign).
const (
	// SlicePlanned: a slice committed with its checkpoint.
	SlicePlanned = "planned"
	// SliceLate: the campaign's deadline passed: it ended late.
	SliceLate = "late"
	// SliceDeferred: the planner was stopping and gave the command back.
	SliceDeferred = "deferred"
	// SliceRepublished: a lost continuation was published again.
	SliceRepublished = "republished"
	// SliceDuplicate: a replayed, duplicated or stale-fenced command
	// dropped (nudge_campaign_duplicates_suppressed_total says which).
	SliceDuplicate = "duplicate"
	// SliceInactive: the campaign is paused, done, canceled or gone.
	SliceInactive = "inactive"
	// SlicePoison: the command could not be verified; dead-lettered.
	SlicePoison = "poison"
	// SliceLeaseExpired: the slice ran past its lease, and PostgreSQL
	// ended its transaction (statement or idle timeout): nothing written.
	SliceLeaseExpired = "lease_expired"
	// SliceFailed: any other error; the command is given back.
	SliceFailed = "failed"
)

// SliceOutcomes lists every slice outcome.
var SliceOutcomes = []string{SlicePlanned, SliceLate, SliceDeferred, SliceRepublished, SliceDuplicate,
	SliceInactive, SlicePoison, SliceLeaseExpired, SliceFailed}

// Planning duplicate kinds, for nudge_campaign_duplicates_suppressed_total{kind}.
const (
	// PlanDupStale: a command for a fence the campaign has passed (a
	// replay, a duplicate publish, a delayed planner's continuation).
	PlanDupStale = "stale"
	// PlanDupAhead: a command for a fence the campaign has not reached
	// (not published by a planner).
	PlanDupAhead = "ahead"
)

// SliceBuckets span 5 ms to 10 min: a slice takes milliseconds and its lease
// bounds it (at most 10 minutes, schema 20).
var SliceBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 600}

// Planner is the campaign planner's metrics, on its own registry; every
// method is safe on a nil *Planner.
type Planner struct {
	slices     *prometheus.CounterVec
	duplicates *prometheus.CounterVec
	extensions prometheus.Counter
	duration   prometheus.Histogram
}

// NewPlanner creates the planner's metrics, every label value at zero, and
// registers them with reg (nil: not registered).
func NewPlanner(reg prometheus.Registerer) *Planner {
	m := &Planner{
		slices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_campaign_slices_total",
			Help: "Planning commands a planner handled, by outcome: planned, late, deferred, republished, duplicate, inactive, poison, lease_expired, failed.",
		}, []string{"outcome"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_campaign_duplicates_suppressed_total",
			Help: "Planning commands the campaign's fence dropped without writing, by kind: stale (replayed, duplicated, or a delayed planner's), ahead.",
		}, []string{"kind"}),
		extensions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nudge_campaign_lease_extensions_total",
			Help: "Continuations published (confirmed): a campaign's planning carried on to one more slice under a fresh lease, instead of one lease stretched.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nudge_campaign_slice_duration_seconds",
			Help:    "Time a planned slice took: its transaction (lock, read, write, checkpoint) and its continuation's confirm.",
			Buckets: SliceBuckets,
		}),
	}
	for _, o := range SliceOutcomes {
		m.slices.WithLabelValues(o)
	}
	for _, k := range []string{PlanDupStale, PlanDupAhead} {
		m.duplicates.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(m.slices, m.duplicates, m.extensions, m.duration)
	}
	return m
}

// Slice records one planning command's outcome; a planned slice's time is
// observed too. dupKind is the duplicate's kind (outcome SliceDuplicate).
func (m *Planner) Slice(outcome, dupKind string, took time.Duration) {
	if m == nil {
		return
	}
	m.slices.WithLabelValues(outcome).Inc()
	switch outcome {
	case SlicePlanned:
		m.duration.Observe(took.Seconds())
	case SliceDuplicate:
		m.duplicates.WithLabelValues(dupKind).Inc()
	}
}

// LeaseExtended records a continuation published.
func (m *Planner) LeaseExtended() {
	if m != nil {
		m.extensions.Inc()
	}
}

// PlanningCollector derives the planning gauges from the campaigns table at
// scrape time, with one statement under a timeout. Each planner registers it
// on its probe port: the values are the table's truth, so every replica
// reports the same (alert on max()). Its cost follows the campaigns still
// planning (the campaigns_runnable index, schema 26, and each one's newest
// checkpoint by primary key), never the reminders table nor ended campaigns.
//
//	nudge_campaign_oldest_runnable_seconds  how long the oldest campaign still planning has
//	                                        waited for its next slice: since its last
//	                                        checkpoint, its creation or its resume (0: none)
//	nudge_campaign_checkpoint_lag_seconds   the longest time a campaign still planning has gone
//	                                        without a checkpoint (since its creation if none)
//	nudge_campaigns_runnable                campaigns still planning
//	nudge_campaign_scrape_success           1 if the last scrape succeeded, 0 if not
type PlanningCollector struct {
	DB    pg.Querier
	Clock clock.Clock
	// Timeout bounds a scrape's statement. Zero value: 5 seconds.
	Timeout time.Duration
}

var planningDescs = struct{ oldest, lag, runnable, success *prometheus.Desc }{
	oldest: prometheus.NewDesc("nudge_campaign_oldest_runnable_seconds",
		"How long the oldest campaign still planning has waited for its next slice (its planning command): since its last checkpoint, creation or resume (0: none).", nil, nil),
	lag: prometheus.NewDesc("nudge_campaign_checkpoint_lag_seconds",
		"The longest time a campaign still planning has gone without a checkpoint (since its creation when it has none; 0: none planning).", nil, nil),
	runnable: prometheus.NewDesc("nudge_campaigns_runnable", "Campaigns still planning.", nil, nil),
	success:  prometheus.NewDesc("nudge_campaign_scrape_success", "1 if the last campaign scrape succeeded, 0 if not.", nil, nil),
}

// Describe implements prometheus.Collector.
func (c *PlanningCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- planningDescs.oldest
	ch <- planningDescs.lag
	ch <- planningDescs.runnable
	ch <- planningDescs.success
}

// Collect implements prometheus.Collector.
func (c *PlanningCollector) Collect(ch chan<- prometheus.Metric) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	now := c.Clock.Now()
	var (
		oldest, checkpoint *time.Time
		runnable           int64
	)
	err := c.DB.QueryRow(ctx, query("PlanningGauges")).Scan(&oldest, &checkpoint, &runnable)
	success := 0.0
	if err == nil {
		success = 1
		age := func(t *time.Time) float64 {
			if t == nil {
				return 0
			}
			return max(now.Sub(*t), 0).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(planningDescs.oldest, prometheus.GaugeValue, age(oldest))
		ch <- prometheus.MustNewConstMetric(planningDescs.lag, prometheus.GaugeValue, age(checkpoint))
		ch <- prometheus.MustNewConstMetric(planningDescs.runnable, prometheus.GaugeValue, float64(runnable))
	}
	ch <- prometheus.MustNewConstMetric(planningDescs.success, prometheus.GaugeValue, success)
}
