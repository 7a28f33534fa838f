package e2e_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// The deadline holds at the provider, not only in the worker (issue 14):
// 500 SMS reminders due now with deadlines spread over 1–10 s, a provider
// that answers in 200 ms, three workers with their default deadline margin
// (learned from the provider's latency), and a fleet-wide limit of 40 sends
// a second, so that many sends get rate-limit slots close to their
// deadlines. From the provider's own record: no request arrives and nothing
// is accepted at or after its reminder's deadline.
//
// One run takes about 12 s. The issue asks for ten clean runs:
// CI=true go test -count=10 -run TestNoSMSAcceptedAtOrAfterItsDeadline ./internal/e2e/
func TestNoSMSAcceptedAtOrAfterItsDeadline(t *testing.T) {
	t.Parallel()
	const (
		total   = 500
		latency = 200 * time.Millisecond
	)
	f := newSMSFleet(t, fakesms.WithConfig(fakesms.Config{Delay: latency}))
	ctx := context.Background()

	now := time.Now()
	reqs := make([]intake.Request, total)
	for i := range reqs {
		// Deadlines 1–10 s away, in an order unrelated to the queue's.
		spread := time.Duration((i*7919)%total) * 9 * time.Second / total
		reqs[i] = intake.Request{Tenant: fmt.Sprint("tenant-", i%3), Key: fmt.Sprint("k", i), Channel: reminder.SMS,
			Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
			DueAt: now.Add(-time.Second), Deadline: now.Add(time.Second + spread)}
	}
	out, err := intake.ScheduleMany(ctx, f.db.Pool, reqs)
	require.NoError(t, err)
	for _, o := range out {
		require.NoError(t, o.Err)
	}
	limits, err := ratelimit.Parse([]byte(`{"version": "deadline", "channels": {"sms": {"account": "main", "rate": 40, "burst": 5}}}`))
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 3 {
		f.startMarginWorker(t, runCtx, fmt.Sprint("sms-", i), ratelimit.New(f.db.Pool, limits), &wg)
	}
	sum, err := f.dispatcher("dispatcher").RunOnce(ctx)
	require.NoError(t, err)
	// On a loaded machine the first deadlines (1 s away when scheduled) can
	// pass before the claim: those expire at the dispatcher, never sent.
	require.Equal(t, total, sum.Enqueued+sum.Expired)
	rec := &reconcile.Reconciler{Enqueuer: f.enqueuer("reconciler"), Config: reconcile.Config{Overdue: 30 * time.Second}, Log: f.log}
	wg.Go(func() { _ = rec.Loop(runCtx, time.Second) })
	f.waitTerminal(t, time.Minute)
	stop()
	wg.Wait()

	rows := f.rows(t)
	byKey := map[string]row{}
	byState := map[reminder.State]int{}
	for _, r := range rows {
		byKey[r.idem] = r
		byState[r.state]++
	}
	// From the provider's record: when each accepted message was accepted,
	// and when each request arrived.
	var late []string
	var margins []time.Duration // how long before its deadline each was accepted
	for _, m := range f.smsSrv.Messages() {
		r, ok := byKey[m.IdempotencyKey]
		require.True(t, ok, "accepted message %s has no reminder", m.ID)
		if !m.AcceptedAt.Before(r.deadline) {
			late = append(late, fmt.Sprintf("reminder %d accepted %s after its deadline", r.id, m.AcceptedAt.Sub(r.deadline)))
		}
		margins = append(margins, r.deadline.Sub(m.AcceptedAt))
	}
	arrivedLate := 0
	for _, a := range f.smsSrv.Attempts() {
		if r := byKey[a.IdempotencyKey]; !a.Time.Before(r.deadline) {
			arrivedLate++
		}
	}
	var byReason = map[string]float64{}
	for _, reg := range f.regs {
		fams := scrape(t, reg)
		for _, code := range []string{"delivered", "deadline", "deadline_margin", "rate_limited", "timeout", "slot_missed"} {
			byReason[code] += sumWhere(fams["nudge_outcomes_total"], "reason", code)
		}
	}
	sort.Slice(margins, func(i, j int) bool { return margins[i] < margins[j] })
	require.NotEmpty(t, margins, "nothing was accepted")
	t.Logf("states %v; workers' outcomes by reason %v; provider: %d attempts, %d accepted, the closest %s before its deadline",
		byState, byReason, len(f.smsSrv.Attempts()), len(margins), margins[0].Round(time.Millisecond))

	require.Empty(t, late, "accepted by the provider at or after the deadline")
	require.Zero(t, arrivedLate, "requests reached the provider at or after their deadline")
	require.Len(t, rows, total)
	require.Equal(t, byState[reminder.Delivered], len(margins), "one accepted message per delivered reminder")
	require.Greater(t, byState[reminder.Delivered], total/4, "a run that delivers little proves little")
}

// startMarginWorker runs an SMS worker with the default deadline margin and
// the fleet-wide limiter lim, in wg until ctx ends.
func (f *fleet) startMarginWorker(t *testing.T, ctx context.Context, name string, lim *ratelimit.Limiter, wg *sync.WaitGroup) {
	t.Helper()
	c, err := sms.New(sms.Config{URL: f.smsURL})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	f.regs = append(f.regs, reg)
	w, err := worker.New(worker.Config{Channel: reminder.SMS, Name: name, Concurrency: 2, Batch: 25, Grace: 10 * time.Second},
		worker.Deps{AMQPURL: f.mq.URL, Topology: f.mq.Topology, Store: f.store, Keys: f.keys, Sender: c, Limiter: lim,
			Clock: clock.Real{}, Log: f.log.With().Str("worker", name).Logger(), Metrics: metrics.New(reg)})
	require.NoError(t, err)
	f.workers = append(f.workers, w)
	wg.Go(func() { _ = w.Run(ctx) })
}
