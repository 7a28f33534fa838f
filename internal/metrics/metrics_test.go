package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/metrics/metricstest"
	"github.com/nudgehq/nudge/internal/ops/opstest"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func values(t *testing.T, g prometheus.Gatherer) map[string]float64 { return metricstest.Values(t, g) }

// series counts the series of one metric name in vs.
func series(vs map[string]float64, name string) int {
	n := 0
	for k := range vs {
		if k == name || strings.HasPrefix(k, name+"{") {
			n++
		}
	}
	return n
}

// Every metric is registered on the registry given, under its documented
// name, and each helper is one call that moves exactly its series.
func TestHelpersRecordOnTheirOwnRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)

	m.Outcome("email", "delivered", "delivered")
	m.Outcome("sms", "expired", "deadline reached before the send started")
	m.Outcomes("email", "failed", "permanent failure: invalid_address", 3)
	m.Retry("sms", "retry 2 in 5s: http_503")
	m.LeaseExpired(metrics.LeaseSend, 2)
	m.Duplicate("email", metrics.DupConsume)
	m.RateLimitDeferral("sms", "tenant")
	m.DeadLettered("email", "unverifiable: message is not signed")
	m.Hop(metrics.HopDueToClaim, "email", 1500*time.Millisecond)
	m.HopBetween(metrics.HopEnqueueToStart, "email", time.Time{}, time.Now()) // unknown start: ignored
	m.HopEnded("sms", "failed", time.Now().Add(-time.Second), time.Now())
	m.HopEnded("sms", "delivered", time.Time{}, time.Now()) // unknown start: ignored
	m.ReconcilePass(time.Second, nil, time.Unix(1700000000, 0))
	m.ReconcilePass(time.Second, errors.New("db down"), time.Unix(1700000100, 0))
	m.DeadlineMiss("", 4)
	m.Retention("reminders", 10)
	m.PrefetchWindow("sms", 16, false) // a session's first consumer
	m.PrefetchWindow("sms", 32, true)  // a new window
	m.PrefetchWindow("email", 400, false)

	vs := values(t, reg)
	for k, want := range map[string]float64{
		`nudge_outcomes_total{channel="email",outcome="delivered",reason="delivered"}`:                            1,
		`nudge_outcomes_total{channel="sms",outcome="expired",reason="deadline_reached_before_the_send_started"}`: 1,
		`nudge_outcomes_total{channel="email",outcome="failed",reason="invalid_address"}`:                         3,
		`nudge_deadline_misses_total{channel="sms"}`:                                                              1, // an expiry is a miss
		`nudge_deadline_misses_total{channel=""}`:                                                                 4,
		`nudge_retries_total{channel="sms",reason="http_503"}`:                                                    1,
		`nudge_lease_expirations_total{lease="send"}`:                                                             2,
		`nudge_duplicates_suppressed_total{channel="email",kind="consume"}`:                                       1,
		`nudge_rate_limit_deferrals_total{channel="sms",limit="tenant"}`:                                          1,
		`nudge_dead_lettered_total{channel="email",reason="unverifiable_message_is_not_signed"}`:                  1,
		`nudge_hop_latency_seconds_count{channel="email",hop="due_to_claim",outcome=""}`:                          1,
		`nudge_hop_latency_seconds_count{channel="sms",hop="start_to_terminal",outcome="failed"}`:                 1,
		`nudge_reconcile_pass_duration_seconds_count{result="ok"}`:                                                1,
		`nudge_reconcile_pass_duration_seconds_count{result="error"}`:                                             1,
		`nudge_reconcile_last_success_timestamp_seconds`:                                                          1700000000, // the failed pass did not move it
		`nudge_retention_removed_total{kind="reminders"}`:                                                         10,
		`nudge_prefetch_windows_total{channel="sms"}`:                                                             1,
		`nudge_prefetch_window_messages{channel="sms"}`:                                                           32,
		`nudge_prefetch_window_messages{channel="email"}`:                                                         400,
	} {
		require.Contains(t, vs, k)
		require.Equal(t, want, vs[k], k)
	}
	require.Equal(t, 2, series(vs, "nudge_hop_latency_seconds_count"), "a hop with an unknown start is not observed")
	require.Equal(t, 1, series(vs, "nudge_prefetch_windows_total"), "a session's first consumer is not counted")
}

// A process without metrics calls the same helpers on a nil *Metrics.
func TestNilMetricsAreANoop(t *testing.T) {
	t.Parallel()
	var m *metrics.Metrics
	m.Outcome("email", "delivered", "x")
	m.Outcomes("email", "delivered", "x", 2)
	m.Retry("email", "x")
	m.LeaseExpired(metrics.LeaseDispatch, 1)
	m.Duplicate("email", metrics.DupClaim)
	m.RateLimitDeferral("email", "channel")
	m.DeadLettered("email", "x")
	m.Hop(metrics.HopClaimToEnqueue, "email", time.Second)
	m.HopBetween(metrics.HopClaimToEnqueue, "email", time.Now(), time.Now())
	m.HopEnded("email", "delivered", time.Now(), time.Now())
	m.ReconcilePass(time.Second, nil, time.Now())
	m.DeadlineMiss("email", 1)
	m.Retention("events", 1)
	m.PrefetchWindow("email", 16, true)
}

func TestReasonIsBounded(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"retry 2 in 5s: http_503":                  "http_503",
		"permanent failure: invalid_address":       "invalid_address",
		"attempts exhausted (5): timeout":          "timeout",
		"deadline passed while enqueued":           "deadline_passed_while_enqueued",
		"":                                         "none",
		"unverifiable: message signature is wrong": "unverifiable_message_signature_is_wrong",
		strings.Repeat("x", 100):                   strings.Repeat("x", 48),
	} {
		require.Equal(t, want, metrics.Reason(in), "Reason(%q)", in)
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	for i := range 80 {
		m.Retry("email", fmt.Sprintf("odd error number %d", i))
	}
	vs := values(t, reg)
	require.Equal(t, 51, series(vs, "nudge_retries_total"), "50 reasons, then other")
	require.Equal(t, 30.0, vs[`nudge_retries_total{channel="email",reason="other"}`])
}

// The collector's gauges agree with the table, read with one statement.
func TestDBCollectorAgreesWithTheDatabase(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	clk := clock.NewFake(now)
	c := metrics.NewDBCollector(db.Pool, clk)
	c.DLQDepth = func(context.Context) (map[string]int, error) { return map[string]int{"email": 3}, nil }
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	// Nothing yet: every gauge present and zero; no cutoff lag until a run is recorded.
	vs := values(t, reg)
	require.Equal(t, 0.0, vs["nudge_oldest_due_age_seconds"])
	require.Contains(t, vs, "nudge_oldest_due_age_seconds")
	require.Zero(t, series(vs, "nudge_dispatch_cutoff_lag_seconds"))
	require.Equal(t, 6*len(reminder.Channels), series(vs, "nudge_open_reminders"), "every channel × open state, zeros included")
	// Its value is the shared test database's (TestDBCollectorOldestTransaction
	// checks it in a database of its own).
	require.Contains(t, vs, "nudge_db_oldest_transaction_age_seconds")

	ins := func(r opstest.Row) int64 { return opstest.Insert(t, db.Pool, r) }
	ins(opstest.Row{Key: "due-old", DueAt: now.Add(-90 * time.Second)})
	ins(opstest.Row{Key: "due-new", DueAt: now.Add(-10 * time.Second)})
	ins(opstest.Row{Key: "future", DueAt: now.Add(time.Hour)})
	ins(opstest.Row{Key: "enq", State: reminder.Enqueued, Since: now.Add(-45 * time.Second), Channel: reminder.SMS})
	ins(opstest.Row{Key: "q", State: reminder.Quarantined, Channel: reminder.SMS})
	ins(opstest.Row{Key: "snd", State: reminder.Sending, Since: now.Add(time.Minute), Channel: reminder.SMS}) // a live send lease
	// Past its deadline but not yet expired by the reconciler: 2 minutes owed.
	ins(opstest.Row{Key: "late", State: reminder.Retrying, DueAt: now.Add(-time.Hour), Deadline: now.Add(-2 * time.Minute),
		Since: now.Add(time.Minute)})
	ins(opstest.Row{Key: "missed", State: reminder.Expired, Since: now.Add(-10 * time.Minute), Reason: "deadline passed while pending"})
	ins(opstest.Row{Key: "missed-old", State: reminder.Expired, Since: now.Add(-2 * time.Hour)})
	ins(opstest.Row{Key: "operator", State: reminder.Expired, Since: now.Add(-time.Minute), Reason: "dlq expire: poison"})
	ins(opstest.Row{Key: "done", State: reminder.Delivered, Since: now.Add(-time.Minute)})
	require.NoError(t, dispatch.RecordRun(ctx, db.Pool, "d", dispatch.Summary{Cutoff: now.Add(-30 * time.Second)},
		now.Add(-29*time.Second), nil))
	require.NoError(t, dispatch.RecordRun(ctx, db.Pool, "d", dispatch.Summary{Cutoff: now.Add(-5 * time.Second), OutOfBudget: true},
		now.Add(-4*time.Second), nil)) // did not finish its cutoff: not counted

	_, err := db.Pool.Exec(ctx, `ANALYZE reminders, reminder_state`)
	require.NoError(t, err)

	vs = values(t, reg)
	for k, want := range map[string]float64{
		"nudge_pending_reminders_estimate":                        3, // the future one too
		"nudge_oldest_due_age_seconds":                            90,
		"nudge_oldest_enqueued_age_seconds":                       45,
		"nudge_reconcile_lag_seconds":                             120,
		"nudge_dispatch_cutoff_lag_seconds":                       30,
		`nudge_deadline_misses_last_hour{channel="email"}`:        1, // not the older one, not the operator's expiry
		`nudge_deadline_misses_last_hour{channel="sms"}`:          0,
		`nudge_dead_letter_messages{channel="email"}`:             3,
		`nudge_dead_letter_messages{channel="sms"}`:               0,
		"nudge_db_scrape_success":                                 1,
		`nudge_open_reminders{channel="email",state="pending"}`:   2, // due ones only
		`nudge_open_reminders{channel="email",state="retrying"}`:  1,
		`nudge_open_reminders{channel="sms",state="enqueued"}`:    1,
		`nudge_open_reminders{channel="sms",state="quarantined"}`: 1,
		`nudge_open_reminders{channel="sms",state="sending"}`:     1,
	} {
		require.Contains(t, vs, k)
		require.Equal(t, want, vs[k], k)
	}
	// Every open-count series agrees with the table (pending: those due).
	for k, v := range vs {
		if !strings.HasPrefix(k, "nudge_open_reminders{") {
			continue
		}
		var ch, st string
		_, err := fmt.Sscanf(strings.NewReplacer(`"`, " ", ",", " ", "}", " ").Replace(k), "nudge_open_reminders{channel= %s state= %s", &ch, &st)
		require.NoError(t, err, k)
		var n float64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_state WHERE channel = $1 AND state = $2 AND (state <> 'pending' OR due_at <= $3)`, ch, st, now).Scan(&n))
		require.Equal(t, n, v, k)
	}
}

// A scrape that cannot reach the database says so instead of failing the
// whole /metrics page.
func TestDBCollectorReportsFailure(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	_, err := db.Pool.Exec(context.Background(), `DROP TABLE dispatch_runs`)
	require.NoError(t, err)
	c := metrics.NewDBCollector(db.Pool, clock.Real{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	vs := values(t, reg)
	require.Equal(t, 0.0, vs["nudge_db_scrape_success"])
	require.Contains(t, vs, "nudge_db_scrape_success")
	require.Zero(t, series(vs, "nudge_oldest_due_age_seconds"))
	require.Contains(t, vs, "nudge_db_oldest_transaction_age_seconds", "it reads none of Nudge's tables")
}

// pushgateway is a stand-in that records what was pushed.
type pushgateway struct {
	mu     sync.Mutex
	method string
	path   string
	body   string
}

func (p *pushgateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	p.method, p.path, p.body = r.Method, r.URL.Path, string(b)
	p.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func TestPushDispatchRun(t *testing.T) {
	t.Parallel()
	gw := &pushgateway{}
	srv := httptest.NewServer(gw)
	defer srv.Close()
	cutoff := time.Unix(1700000000, 0)
	run := metrics.DispatchRun{Cutoff: cutoff, Finished: cutoff.Add(2 * time.Second), Elapsed: 2 * time.Second,
		Batches: 2, Claimed: 700, Enqueued: 690, Expired: 10}
	extra := prometheus.NewRegistry()
	m := metrics.New(extra)
	m.Hop(metrics.HopDueToClaim, "email", time.Second)

	require.NoError(t, metrics.PushDispatchRun(context.Background(), srv.URL, run, extra))
	require.Equal(t, http.MethodPut, gw.method, "a successful run replaces the group")
	require.Equal(t, "/metrics/job/"+metrics.PushJob, gw.path)
	// The body is protobuf-delimited; the metric names are in it verbatim.
	for _, name := range []string{"nudge_dispatch_last_run_timestamp_seconds", "nudge_dispatch_last_success_timestamp_seconds",
		"nudge_dispatch_cutoff_timestamp_seconds", "nudge_dispatch_run_reminders", "nudge_dispatch_run_success",
		"nudge_hop_latency_seconds"} {
		require.Contains(t, gw.body, name)
	}

	run.Err = errors.New("broker down")
	require.NoError(t, metrics.PushDispatchRun(context.Background(), srv.URL, run, nil))
	require.Equal(t, http.MethodPost, gw.method, "a failed run is added, keeping the last success")
	require.NotContains(t, gw.body, "nudge_dispatch_last_success_timestamp_seconds")
	require.Contains(t, gw.body, "nudge_dispatch_run_success")

	require.NoError(t, metrics.PushDispatchRun(context.Background(), "", run, nil), "no address: nothing to do")
}

// Issue 17: every process registered every family, so workers exported
// nudge_reconcile_last_success_timestamp_seconds 0, and a counter appeared
// only at its first event (rate() and the alerts missed it). Now each
// component registers what it sets, every known series at zero.
func TestEachComponentExportsWhatItSetsFromTheStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c        metrics.Component
		channels []string
		want     []string
		absent   []string
	}{
		{c: metrics.Worker, channels: []string{"sms"},
			want: []string{`nudge_deadline_misses_total{channel="sms"}`, `nudge_duplicates_suppressed_total{channel="sms",kind="stale"}`,
				`nudge_outcomes_total{channel="sms",outcome="delivered",reason="delivered"}`,
				`nudge_hop_latency_seconds_count{channel="sms",hop="enqueue_to_start",outcome=""}`,
				// The attempt's hop, split by outcome: every outcome from the start.
				`nudge_hop_latency_seconds_count{channel="sms",hop="start_to_terminal",outcome="delivered"}`,
				`nudge_hop_latency_seconds_count{channel="sms",hop="start_to_terminal",outcome="failed"}`,
				`nudge_hop_latency_seconds_count{channel="sms",hop="start_to_terminal",outcome="expired"}`,
				`nudge_hop_latency_seconds_count{channel="sms",hop="start_to_terminal",outcome="retrying"}`,
				`nudge_hop_latency_seconds_count{channel="sms",hop="start_to_terminal",outcome="quarantined"}`,
				`nudge_prefetch_windows_total{channel="sms"}`},
			absent: []string{"nudge_reconcile_last_success_timestamp_seconds", "nudge_lease_expirations_total",
				"nudge_prefetch_window_messages", // set by the first consumer, not before
				`nudge_deadline_misses_total{channel="email"}`}},
		{c: metrics.Reconciler, channels: []string{"email", "sms"},
			want: []string{"nudge_reconcile_last_success_timestamp_seconds", `nudge_lease_expirations_total{lease="send"}`,
				`nudge_lease_expirations_total{lease="dispatch"}`, `nudge_deadline_misses_total{channel="email"}`,
				`nudge_outcomes_total{channel="sms",outcome="expired",reason="deadline_passed"}`},
			absent: []string{"nudge_hop_latency_seconds_count", "nudge_retries_total", `nudge_deadline_misses_total{channel=""}`,
				"nudge_prefetch_windows_total", "nudge_prefetch_window_messages"}},
		{c: metrics.Dispatcher, channels: []string{"email", "sms"},
			want: []string{`nudge_hop_latency_seconds_count{channel="email",hop="due_to_claim",outcome=""}`,
				`nudge_hop_latency_seconds_count{channel="sms",hop="claim_to_enqueue",outcome=""}`, `nudge_deadline_misses_total{channel="sms"}`},
			absent: []string{"nudge_reconcile_last_success_timestamp_seconds", "nudge_lease_expirations_total"}},
	} {
		t.Run(string(tc.c), func(t *testing.T) {
			reg := prometheus.NewRegistry()
			metrics.NewFor(reg, tc.c, tc.channels...)
			vs := values(t, reg)
			for _, k := range tc.want {
				require.Contains(t, vs, k)
				require.Zero(t, vs[k], k)
			}
			for _, name := range tc.absent {
				for k := range vs {
					require.False(t, k == name || strings.HasPrefix(k, name+"{"), "%s exports %s", tc.c, k)
				}
			}
		})
	}
}

// A run's hops are what the registry observed since the previous run.
func TestHopCountsSince(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.NewFor(reg, metrics.Dispatcher, "email", "sms")
	first, err := metrics.GatherHops(reg)
	require.NoError(t, err)
	require.Empty(t, first.Since(nil), "nothing observed yet")
	m.Hop(metrics.HopDueToClaim, "email", 3*time.Second)
	m.Hop(metrics.HopDueToClaim, "email", 20*time.Millisecond)
	second, err := metrics.GatherHops(reg)
	require.NoError(t, err)
	m.Hop(metrics.HopDueToClaim, "email", time.Hour)
	third, err := metrics.GatherHops(reg)
	require.NoError(t, err)

	d := second.Since(first)
	require.Len(t, d, 1)
	h := d["due_to_claim/email"]
	require.EqualValues(t, 2, h.Count)
	require.InDelta(t, 3.02, h.Sum, 1e-9)
	require.Len(t, h.Buckets, len(metrics.LatencyBuckets))
	require.EqualValues(t, 1, h.Buckets[1], "≤ 50 ms")
	require.EqualValues(t, 2, h.Buckets[7], "≤ 5 s")
	d = third.Since(second)
	require.EqualValues(t, 1, d["due_to_claim/email"].Count)
	require.EqualValues(t, []uint64{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, d["due_to_claim/email"].Buckets)
}

// The collector counts the runs recorded after its start, once each, and
// keeps the newest success's time across failed runs.
func TestDispatchRunCollectorCountsNewRunsOnce(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	hops := metrics.HopCounts{"due_to_claim/sms": {Count: 2, Sum: 1.5,
		Buckets: []uint64{0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}}}
	require.NoError(t, dispatch.RecordRun(ctx, db.Pool, "d", dispatch.Summary{Cutoff: now, Hops: hops}, now, nil))
	c := &metrics.DispatchRunCollector{DB: db.Pool, Channels: []string{"email", "sms"}}
	require.NoError(t, c.Start(ctx))
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	vs := values(t, reg)
	require.Zero(t, vs[`nudge_hop_latency_seconds_count{channel="sms",hop="due_to_claim"}`], "before the start")
	require.Equal(t, float64(now.Unix()), vs["nudge_dispatch_last_success_timestamp_seconds"])

	require.NoError(t, dispatch.RecordRun(ctx, db.Pool, "d", dispatch.Summary{Cutoff: now, Hops: hops}, now.Add(time.Minute), nil))
	require.NoError(t, dispatch.RecordRun(ctx, db.Pool, "d", dispatch.Summary{Cutoff: now}, now.Add(2*time.Minute),
		errors.New("broker down")))
	for range 2 {
		vs = values(t, reg)
		require.Equal(t, 2.0, vs[`nudge_hop_latency_seconds_count{channel="sms",hop="due_to_claim"}`])
		require.Zero(t, vs[`nudge_hop_latency_seconds_count{channel="email",hop="due_to_claim"}`])
		require.Equal(t, float64(now.Add(time.Minute).Unix()), vs["nudge_dispatch_last_success_timestamp_seconds"])
		require.Equal(t, float64(now.Add(2*time.Minute).Unix()), vs["nudge_dispatch_last_run_timestamp_seconds"])
		require.Equal(t, 1.0, vs[`nudge_dispatch_runs_total{result="ok"}`])
		require.Equal(t, 1.0, vs[`nudge_dispatch_runs_total{result="error"}`])
	}
}

// The promoter's gauges (schema 38) come from its watermark row: absent
// before a pass ran; then its lag (now + H − provisional end, the cursor of
// a sweep in progress when farther) and the final watermark's age.
func TestDBCollectorPromoterGauges(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewDBCollector(db.Pool, clock.NewFake(now)))
	vs := values(t, reg)
	require.Equal(t, 1.0, vs["nudge_db_scrape_success"])
	require.Zero(t, series(vs, "nudge_promoter_lag_seconds"), "no pass yet")

	_, err := db.Pool.Exec(ctx, `UPDATE nudge_promoter SET passed_at = $1, ahead = interval '1 hour',
		final_until = $1::timestamptz - interval '10 minutes', prov_until = $1::timestamptz + interval '50 minutes'`, now)
	require.NoError(t, err)
	vs = values(t, reg)
	require.Equal(t, 600.0, vs["nudge_promoter_lag_seconds"])
	require.Equal(t, 600.0, vs["nudge_promoter_final_age_seconds"])

	_, err = db.Pool.Exec(ctx, `UPDATE nudge_promoter SET sweep_until = $1::timestamptz + interval '1 hour',
		sweep_wait = '{}', sweep_prev_done = true, cursor_due = $1::timestamptz + interval '55 minutes', cursor_id = 1`, now)
	require.NoError(t, err)
	require.Equal(t, 300.0, values(t, reg)["nudge_promoter_lag_seconds"], "the sweep's cursor is farther")
}

// A reminder due by now without its state row (the due-ordered store's
// promoter has not inserted it: schema 39) is pending: it is the oldest due
// reminder, past its deadline it is owed an expiry, and it is counted with
// the due pending ones; one due later is not.
func TestDBCollectorCountsUnpromoted(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	now := time.Now().UTC().Truncate(time.Second)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewDBCollector(db.Pool, clock.NewFake(now)))
	ins := func(r opstest.Row) int64 { return opstest.Insert(t, db.Pool, r) }
	ins(opstest.Row{Key: "due", DueAt: now.Add(-30 * time.Second)})
	lagging := ins(opstest.Row{Key: "lagging", DueAt: now.Add(-10 * time.Minute), Deadline: now.Add(-3 * time.Minute)})
	sms := ins(opstest.Row{Key: "sms", DueAt: now.Add(-time.Minute), Channel: reminder.SMS})
	later := ins(opstest.Row{Key: "later", DueAt: now.Add(24 * time.Hour)})
	db.Unpromote(t, lagging, sms, later)

	vs := values(t, reg)
	for k, want := range map[string]float64{
		"nudge_oldest_due_age_seconds":                          600,
		"nudge_reconcile_lag_seconds":                           180,
		`nudge_open_reminders{channel="email",state="pending"}`: 2,
		`nudge_open_reminders{channel="sms",state="pending"}`:   1,
	} {
		require.Contains(t, vs, k)
		require.Equal(t, want, vs[k], k)
	}
}
