package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"
)

// PushJob is the Pushgateway job the dispatcher's runs are pushed under.
const PushJob = "nudge_dispatcher"

// DispatchRun is what a dispatcher run reports (from dispatch.Summary).
type DispatchRun struct {
	Cutoff   time.Time
	Finished time.Time
	Elapsed  time.Duration
	Batches  int
	Claimed  int
	Enqueued int
	Expired  int
	Released int
	// OutOfBudget: the run stopped at its budget with due work possibly left.
	OutOfBudget bool
	// Err is the run's error, nil when it succeeded.
	Err error
}

// PushDispatchRun pushes a run's summary to the Pushgateway at addr (a
// no-op when addr is empty), as gauges of the job PushJob:
//
//	nudge_dispatch_last_run_timestamp_seconds      when the run finished
//	nudge_dispatch_last_success_timestamp_seconds  when the last successful run finished
//	nudge_dispatch_cutoff_timestamp_seconds        the run's cutoff
//	nudge_dispatch_run_duration_seconds            how long it took
//	nudge_dispatch_run_reminders{result}           claimed, enqueued, expired, released
//	nudge_dispatch_run_batches                     claim statements
//	nudge_dispatch_run_out_of_budget               1 if it stopped at its budget
//	nudge_dispatch_run_success                     1 if it succeeded
//
// A successful run replaces the job's whole group (PUT), so with extra (the
// run's own registry, say with nudge_hop_latency_seconds) what is pushed is
// exactly the last run. A failed run is added (POST) without the success
// timestamp, which therefore keeps the last successful run's value: alert
// on time() − nudge_dispatch_last_success_timestamp_seconds.
func PushDispatchRun(ctx context.Context, addr string, run DispatchRun, extra prometheus.Gatherer) error {
	if addr == "" {
		return nil
	}
	reg := prometheus.NewRegistry()
	gauge := func(name, help string, v float64) {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		g.Set(v)
		reg.MustRegister(g)
	}
	ts := func(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	gauge("nudge_dispatch_last_run_timestamp_seconds", "Unix time the last dispatcher run finished.", ts(run.Finished))
	if run.Err == nil {
		gauge("nudge_dispatch_last_success_timestamp_seconds", "Unix time the last successful dispatcher run finished.", ts(run.Finished))
	}
	gauge("nudge_dispatch_cutoff_timestamp_seconds", "Cutoff of the last dispatcher run (Unix time).", ts(run.Cutoff))
	gauge("nudge_dispatch_run_duration_seconds", "Duration of the last dispatcher run.", run.Elapsed.Seconds())
	gauge("nudge_dispatch_run_batches", "Claim statements of the last dispatcher run.", float64(run.Batches))
	gauge("nudge_dispatch_run_out_of_budget", "1 if the last dispatcher run stopped at its budget.", b2f(run.OutOfBudget))
	gauge("nudge_dispatch_run_success", "1 if the last dispatcher run succeeded.", b2f(run.Err == nil))
	rem := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nudge_dispatch_run_reminders",
		Help: "Reminders of the last dispatcher run, by result (claimed, enqueued, expired, released).",
	}, []string{"result"})
	for result, n := range map[string]int{"claimed": run.Claimed, "enqueued": run.Enqueued, "expired": run.Expired,
		"released": run.Released} {
		rem.WithLabelValues(result).Set(float64(n))
	}
	reg.MustRegister(rem)

	p := push.New(addr, PushJob).Gatherer(reg)
	if extra != nil {
		p = p.Gatherer(extra)
	}
	var err error
	if run.Err == nil {
		err = p.PushContext(ctx)
	} else {
		err = p.AddContext(ctx)
	}
	if err != nil {
		return fmt.Errorf("pushing the dispatch run to %s: %w", addr, err)
	}
	return nil
}
