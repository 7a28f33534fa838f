// Package metrics defines every Prometheus metric Nudge exports, in one
// place, with the nudge_ prefix and units in the names. Each process builds
// what it needs on its own registry (New takes a prometheus.Registerer;
// nothing touches the global one):
//
//   - workers, dispatcher and reconciler record events with one call each
//     (m.Outcome, m.Retry, m.Hop, …); every method is safe on a nil
//     *Metrics, so a component without metrics calls them all the same.
//     NewFor registers only the families a component sets, each known
//     label combination at zero from the start;
//   - the reconciler registers DBCollector, which derives the gauges that
//     must not depend on any one process being alive (oldest due age, open
//     reminders, deadline misses, reconciliation lag, dispatcher cutoff lag,
//     dead-letter depth, the newest reminder's age) from the database (and
//     broker) at scrape time;
//   - the dispatcher, which exits after each run, records its hop latencies
//     with the run in dispatch_runs, and the reconciler exports them with
//     the runs' success times (DispatchRunCollector). A Pushgateway is
//     optional (PushDispatchRun, when an address is configured).
//
// Label values that come from reasons are normalised (Reason) and bounded
// per metric, so an unexpected error text cannot explode cardinality.
package metrics

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Hops of a reminder's way, for nudge_hop_latency_seconds{hop}.
const (
	// HopDueToClaim: due_at → the dispatcher claimed it.
	HopDueToClaim = "due_to_claim"
	// HopClaimToEnqueue: claimed → the broker confirmed its message.
	HopClaimToEnqueue = "claim_to_enqueue"
	// HopEnqueueToStart: enqueued → a worker claimed the attempt.
	HopEnqueueToStart = "enqueue_to_start"
	// HopStartToTerminal: the attempt started → its outcome was recorded,
	// observed under that outcome (HopOutcomes): the reminder's terminal
	// state, or retrying or quarantined.
	HopStartToTerminal = "start_to_terminal"
)

// HopOutcomes are the values of nudge_hop_latency_seconds{outcome} on
// start_to_terminal: the state the attempt's outcome moved its reminder to.
// The other hops have outcome "" (none).
var HopOutcomes = []string{"delivered", "failed", "expired", "retrying", "quarantined"}

// Duplicate kinds, for nudge_duplicates_suppressed_total{kind}.
const (
	// DupClaim: a claim found the row already claimed under the fence (a
	// second delivery of the same message lost the race).
	DupClaim = "claim"
	// DupConsume: a delivery for a row already past it (terminal, or a newer
	// fence from this message's own earlier delivery).
	DupConsume = "consume"
	// DupSuperseded: a message fenced out by a cancel, expiry, replay or republish.
	DupSuperseded = "superseded"
	// DupStale: an outcome refused because the send lease was taken over.
	DupStale = "stale"
)

// Lease kinds, for nudge_lease_expirations_total{lease}.
const (
	LeaseDispatch = "dispatch"
	LeaseSend     = "send"
)

// LatencyBuckets span 10 ms to 2 h: a hop is milliseconds when healthy and
// can be an hour when a retry tier or an outage is involved.
var LatencyBuckets = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200}

// maxReasons bounds the distinct reason values per metric; more become "other".
const maxReasons = 50

// Metrics are the counters and histograms the processes update. Build with New.
type Metrics struct {
	hop          *prometheus.HistogramVec
	outcomes     *prometheus.CounterVec
	retries      *prometheus.CounterVec
	leases       *prometheus.CounterVec
	duplicates   *prometheus.CounterVec
	misses       *prometheus.CounterVec
	deferrals    *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	reconcile    *prometheus.HistogramVec
	reconcileAt  prometheus.Gauge
	retention    *prometheus.CounterVec
	windows      *prometheus.CounterVec
	window       *prometheus.GaugeVec

	reasons reasonGuard
}

// New creates every metric and registers it with reg (nil: not registered,
// for tests that only call the methods).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		hop: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nudge_hop_latency_seconds",
			Help:    "Time a reminder spent on each hop: due_to_claim, claim_to_enqueue, enqueue_to_start, start_to_terminal (by outcome: delivered, failed, expired, retrying, quarantined; empty on the other hops).",
			Buckets: LatencyBuckets,
		}, []string{"hop", "channel", "outcome"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_outcomes_total",
			Help: "Terminal outcomes recorded by workers and the reconciler, by channel, outcome (delivered, failed, expired, canceled) and reason code.",
		}, []string{"channel", "outcome", "reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_retries_total",
			Help: "Retries scheduled after a retryable failure, by channel and reason code.",
		}, []string{"channel", "reason"}),
		leases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_lease_expirations_total",
			Help: "Leases that expired with their holder gone and were taken over by the reconciler (lease: dispatch or send).",
		}, []string{"lease"}),
		duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_duplicates_suppressed_total",
			Help: "Deliveries or writes the fence absorbed, by channel and kind (claim, consume, superseded, stale).",
		}, []string{"channel", "kind"}),
		misses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_deadline_misses_total",
			Help: "Reminders that expired at their deadline without being delivered, by channel.",
		}, []string{"channel"}),
		deferrals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_rate_limit_deferrals_total",
			Help: "Sends deferred by a rate limit, by channel and limit (channel, account, tenant).",
		}, []string{"channel", "limit"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_dead_lettered_total",
			Help: "Messages this process published to a dead-letter queue, by channel and reason code.",
		}, []string{"channel", "reason"}),
		reconcile: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nudge_reconcile_pass_duration_seconds",
			Help:    "Duration of reconciler passes, by result (ok, error).",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"result"}),
		reconcileAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nudge_reconcile_last_success_timestamp_seconds",
			Help: "Unix time the last successful reconciler pass finished.",
		}),
		retention: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_retention_removed_total",
			Help: "Rows the retention pass removed or emptied, by kind (payloads, attempts, reminders, events, audit, dispatch_runs).",
		}, []string{"kind"}),
		windows: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nudge_prefetch_windows_total",
			Help: "Consumers a worker started anew with another prefetch window, as what its deliveries carried changed (single messages, envelopes), by channel.",
		}, []string{"channel"}),
		window: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nudge_prefetch_window_messages",
			Help: "The prefetch window of a worker's consumer now, in broker messages (an envelope is one), by channel.",
		}, []string{"channel"}),
	}
	if reg != nil {
		reg.MustRegister(m.hop, m.outcomes, m.retries, m.leases, m.duplicates, m.misses, m.deferrals,
			m.deadLettered, m.reconcile, m.reconcileAt, m.retention, m.windows, m.window)
	}
	return m
}

// Component is a process of the fleet, for NewFor.
type Component string

// The fleet's components.
const (
	Dispatcher Component = "dispatcher"
	Worker     Component = "worker"
	Reconciler Component = "reconciler"
)

// NewFor creates the metrics of component c and registers on reg only the
// families c sets (a worker exports no reconciler gauge stuck at 0), each
// with every label combination known at start (channels × what c records)
// at zero, so that alerts and rate() see a series before its first event.
// channels are those c serves: a worker's own, every channel otherwise.
//
// The reconciler registers no hop histogram of its own: its registry's
// nudge_hop_latency_seconds comes from the dispatcher's runs
// (DispatchRunCollector), and its republishes' claim → enqueue hop is not
// observed.
func NewFor(reg prometheus.Registerer, c Component, channels ...string) *Metrics {
	m := New(nil)
	var families []prometheus.Collector
	switch c {
	case Dispatcher:
		families = []prometheus.Collector{m.hop, m.outcomes, m.misses}
		for _, ch := range channels {
			m.hop.WithLabelValues(HopDueToClaim, ch, "")
			m.hop.WithLabelValues(HopClaimToEnqueue, ch, "")
			m.outcomes.WithLabelValues(ch, "expired", "deadline_before_dispatch")
		}
	case Worker:
		families = []prometheus.Collector{m.hop, m.outcomes, m.misses, m.retries, m.duplicates, m.deferrals, m.deadLettered,
			m.windows, m.window}
		for _, ch := range channels {
			m.windows.WithLabelValues(ch)
			m.hop.WithLabelValues(HopEnqueueToStart, ch, "")
			for _, o := range HopOutcomes {
				m.hop.WithLabelValues(HopStartToTerminal, ch, o)
			}
			m.outcomes.WithLabelValues(ch, "delivered", "delivered")
			m.outcomes.WithLabelValues(ch, "expired", "deadline")
			for _, kind := range []string{DupClaim, DupConsume, DupSuperseded, DupStale} {
				m.duplicates.WithLabelValues(ch, kind)
			}
		}
	case Reconciler:
		families = []prometheus.Collector{m.outcomes, m.misses, m.leases, m.reconcile, m.reconcileAt, m.retention}
		for _, ch := range channels {
			m.outcomes.WithLabelValues(ch, "expired", ReconcilerExpiry)
		}
		m.leases.WithLabelValues(LeaseDispatch)
		m.leases.WithLabelValues(LeaseSend)
		m.reconcile.WithLabelValues("ok")
		m.reconcile.WithLabelValues("error")
	default:
		panic("metrics: unknown component " + string(c))
	}
	for _, ch := range channels {
		m.misses.WithLabelValues(ch)
	}
	if reg != nil {
		reg.MustRegister(families...)
	}
	return m
}

// ReconcilerExpiry is the reason label of the reconciler's expiries (the
// transition's code, reminder.CodeDeadlinePassed).
const ReconcilerExpiry = "deadline_passed"

// Hop observes one hop's latency (a negative one, from clock skew, counts as 0).
func (m *Metrics) Hop(hop, channel string, d time.Duration) {
	if m == nil {
		return
	}
	m.hop.WithLabelValues(hop, channel, "").Observe(max(d, 0).Seconds())
}

// HopBetween observes the hop from → to; it does nothing when from is zero.
func (m *Metrics) HopBetween(hop, channel string, from, to time.Time) {
	if m == nil || from.IsZero() {
		return
	}
	m.Hop(hop, channel, to.Sub(from))
}

// HopEnded observes the start_to_terminal hop from → to of an attempt whose
// outcome moved its reminder to outcome (one of HopOutcomes); it does
// nothing when from is zero.
func (m *Metrics) HopEnded(channel, outcome string, from, to time.Time) {
	if m == nil || from.IsZero() {
		return
	}
	m.hop.WithLabelValues(HopStartToTerminal, channel, outcome).Observe(max(to.Sub(from), 0).Seconds())
}

// Outcome counts one terminal outcome (delivered, failed, expired, canceled)
// with a reason code (see Reason). An expiry is also a deadline miss: call
// DeadlineMiss as well only when the expiry is not recorded here.
func (m *Metrics) Outcome(channel, outcome, reason string) {
	if m == nil {
		return
	}
	m.outcomes.WithLabelValues(channel, outcome, m.reasons.value("outcomes", reason)).Inc()
	if outcome == "expired" {
		m.misses.WithLabelValues(channel).Inc()
	}
}

// Outcomes counts n terminal outcomes at once (a batch statement's result).
func (m *Metrics) Outcomes(channel, outcome, reason string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.outcomes.WithLabelValues(channel, outcome, m.reasons.value("outcomes", reason)).Add(float64(n))
	if outcome == "expired" {
		m.misses.WithLabelValues(channel).Add(float64(n))
	}
}

// DeadlineMiss counts n reminders of channel expired without an Outcome call.
func (m *Metrics) DeadlineMiss(channel string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.misses.WithLabelValues(channel).Add(float64(n))
}

// Retry counts one retry scheduled after a retryable failure.
func (m *Metrics) Retry(channel, reason string) {
	if m == nil {
		return
	}
	m.retries.WithLabelValues(channel, m.reasons.value("retries", reason)).Inc()
}

// LeaseExpired counts n expired leases taken over (lease: LeaseDispatch or LeaseSend).
func (m *Metrics) LeaseExpired(lease string, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.leases.WithLabelValues(lease).Add(float64(n))
}

// Duplicate counts one suppressed duplicate (kind: DupClaim, DupConsume, DupSuperseded, DupStale).
func (m *Metrics) Duplicate(channel, kind string) {
	if m == nil {
		return
	}
	m.duplicates.WithLabelValues(channel, kind).Inc()
}

// RateLimitDeferral counts one send deferred by a limit ("channel", "account", "tenant").
func (m *Metrics) RateLimitDeferral(channel, limit string) {
	if m == nil {
		return
	}
	m.deferrals.WithLabelValues(channel, limit).Inc()
}

// DeadLettered counts one message published to a dead-letter queue.
func (m *Metrics) DeadLettered(channel, reason string) {
	if m == nil {
		return
	}
	m.deadLettered.WithLabelValues(channel, m.reasons.value("dead_lettered", reason)).Inc()
}

// ReconcilePass records one reconciler pass: its duration, and the time of
// the last successful one.
func (m *Metrics) ReconcilePass(elapsed time.Duration, err error, finished time.Time) {
	if m == nil {
		return
	}
	if err != nil {
		m.reconcile.WithLabelValues("error").Observe(elapsed.Seconds())
		return
	}
	m.reconcile.WithLabelValues("ok").Observe(elapsed.Seconds())
	m.reconcileAt.Set(float64(finished.UnixNano()) / 1e9)
}

// Retention counts what a retention pass removed (kind: payloads, attempts,
// reminders, events, audit, dispatch_runs).
func (m *Metrics) Retention(kind string, n int64) {
	if m == nil || n <= 0 {
		return
	}
	m.retention.WithLabelValues(kind).Add(float64(n))
}

// PrefetchWindow records the prefetch window, in messages, of the consumer
// a worker of channel started; renewed says it replaced one with another
// window (counted in nudge_prefetch_windows_total), rather than being the
// first of a broker session.
func (m *Metrics) PrefetchWindow(channel string, window int, renewed bool) {
	if m == nil {
		return
	}
	m.window.WithLabelValues(channel).Set(float64(window))
	if renewed {
		m.windows.WithLabelValues(channel).Inc()
	}
}

// Reason turns a free-text reason into a bounded label value. When the
// text ends with a code after ": " (the worker's "retry 2 in 5s: http_503",
// "permanent failure: invalid_address"), the code is kept; otherwise the
// text is lowercased with every run of other characters as "_", at most 48
// characters. Empty becomes "none".
func Reason(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndex(s, ": "); i >= 0 && i+2 < len(s) && !strings.ContainsAny(s[i+2:], " ") {
		s = s[i+2:]
	}
	var b strings.Builder
	underscore := false
	for _, r := range strings.ToLower(s) {
		ok := r >= 'a' && r <= 'z' || r >= '0' && r <= '9'
		switch {
		case ok:
			b.WriteRune(r)
			underscore = false
		case !underscore && b.Len() > 0:
			b.WriteByte('_')
			underscore = true
		}
		if b.Len() >= 48 {
			break
		}
	}
	out := strings.TrimRight(b.String(), "_")
	if out == "" {
		return "none"
	}
	return out
}

// reasonGuard normalises reasons and caps their distinct values per metric.
type reasonGuard struct {
	mu   sync.Mutex
	seen map[string]map[string]bool
}

func (g *reasonGuard) value(metric, reason string) string {
	v := Reason(reason)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seen == nil {
		g.seen = map[string]map[string]bool{}
	}
	s := g.seen[metric]
	if s == nil {
		s = map[string]bool{}
		g.seen[metric] = s
	}
	if s[v] {
		return v
	}
	if len(s) >= maxReasons {
		return "other"
	}
	s[v] = true
	return v
}
