package dispatch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// lazyHorizon sets the test schema's lazy-intake horizon (schema 38).
func (b bundle) lazyHorizon(t *testing.T, h string) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `UPDATE nudge_lazy_intake SET horizon = $1::interval`, h)
	require.NoError(t, err)
}

// scheduleAt schedules one SMS reminder per due time, keyed prefix-i.
func (b bundle) scheduleAt(t *testing.T, prefix string, dues ...time.Time) {
	t.Helper()
	var reqs []intake.Request
	for i, due := range dues {
		reqs = append(reqs, intake.Request{Tenant: "acme", Key: fmt.Sprintf("%s-%d", prefix, i), Channel: reminder.SMS,
			Recipient: fmt.Sprintf("+1415555%04d", i), Template: "course-expiry", DueAt: due, Deadline: due.Add(24 * time.Hour)})
	}
	out, err := intake.ScheduleMany(context.Background(), b.db.Pool, reqs)
	require.NoError(t, err)
	for _, o := range out {
		require.Equal(t, intake.Created, o.Status)
	}
}

// stateOf is the state of key's reminder ("none": no state row).
func (b bundle) stateOf(t *testing.T, key string) string {
	t.Helper()
	var st string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT coalesce(s.state, 'none')
		FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id WHERE r.key = $1`, key).Scan(&st))
	return st
}

// A run promotes the lazy reminders due up to H ahead before it claims,
// claims the promoted ones that are due as any other, and claims nothing
// before it is due; the run's record carries what it promoted.
func TestRunPromotesThenClaimsNothingEarly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.lazyHorizon(t, "2 hours")
	b.scheduleAt(t, "lazy", b.now.Add(2*time.Hour+5*time.Minute), b.now.Add(2*time.Hour+30*time.Minute))
	b.scheduleAt(t, "due", b.now.Add(-time.Minute))
	require.Equal(t, "none", b.stateOf(t, "lazy-0"), "lazy intake left its state row out")
	// Passes reach H ahead of the database's clock, at most the horizon:
	// widened so that a run at a fake clock two hours on reaches them now.
	b.lazyHorizon(t, "4 hours")

	at := b.now.Add(2*time.Hour + 10*time.Minute)
	sum, err := b.dispatcher(b.mq.URL, b.mq.Topology, clock.NewFake(at), dispatch.Config{PromoteAhead: 3 * time.Hour}).
		RunOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 2, sum.Promoted)
	require.Equal(t, 2, sum.Enqueued)
	require.Equal(t, "enqueued", b.stateOf(t, "lazy-0"), "promoted and due: claimed")
	require.Equal(t, "enqueued", b.stateOf(t, "due-0"))
	require.Equal(t, "pending", b.stateOf(t, "lazy-1"), "promoted, due in 20 minutes: not claimed")

	require.NoError(t, dispatch.RecordRun(context.Background(), b.db.Pool, "d", sum, at, nil))
	var promoted int
	var final time.Time
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT promoted, final_until FROM dispatch_runs`).Scan(&promoted, &final))
	require.Equal(t, 2, promoted)
	require.True(t, final.Equal(sum.Final))
}

// A dispatcher back after hours catches up in bounded promoter passes, a
// claim after each, never claiming past what the passes reached, and ends
// the run with every due reminder enqueued.
func TestRunCatchesUpInBoundedPasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.lazyHorizon(t, "2 hours")
	var dues []time.Time
	for i := range 12 {
		dues = append(dues, b.now.Add(2*time.Hour+time.Duration(i+1)*time.Minute))
	}
	b.scheduleAt(t, "lazy", dues...)
	b.lazyHorizon(t, "10 hours") // as above: passes reach them now

	sum, err := b.dispatcher(b.mq.URL, b.mq.Topology, clock.NewFake(b.now.Add(3*time.Hour)),
		dispatch.Config{PromoteAhead: 10 * time.Hour, PromoteBatch: 5}).RunOnce(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 12, sum.Promoted)
	require.Equal(t, 12, sum.Enqueued)
	require.Equal(t, 3, sum.Batches, "a claim after each pass of 5: up to the 5th's due time, the 10th's, then all")
	require.Equal(t, map[reminder.State]int{reminder.Enqueued: 12}, b.states(t))
}

// With the broker down a run only expires what is past its deadline, and a
// lazy reminder is among them only once promoted: the expire-only path runs
// the promoter first, so a reminder intake left without its state row is
// still never delivered late nor left pending past its deadline.
func TestBrokerDownRunPromotesThenExpiresALazyReminder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.lazyHorizon(t, "2 hours")
	due := b.now.Add(2*time.Hour + 5*time.Minute)
	out, err := intake.ScheduleMany(context.Background(), b.db.Pool, []intake.Request{{Tenant: "acme", Key: "late-0",
		Channel: reminder.SMS, Recipient: "+14155550000", Template: "course-expiry", DueAt: due,
		Deadline: due.Add(time.Minute)}})
	require.NoError(t, err)
	require.Equal(t, intake.Created, out[0].Status)
	require.Equal(t, "none", b.stateOf(t, "late-0"), "lazy intake left its state row out")
	b.lazyHorizon(t, "4 hours") // as in TestRunPromotesThenClaimsNothingEarly

	f := clock.NewFake(due.Add(5 * time.Minute)) // past its deadline
	sum, err := b.gated(closedBroker, f, dispatch.Config{PromoteAhead: 3 * time.Hour}).RunOnce(context.Background())
	require.ErrorIs(t, err, dispatch.ErrBrokerUnavailable)
	require.True(t, sum.BrokerDown)
	require.EqualValues(t, 1, sum.Promoted)
	require.Equal(t, 1, sum.Expired)
	require.Zero(t, sum.Claimed)
	require.Equal(t, "expired", b.stateOf(t, "late-0"))
}

// A web transaction that wrote a lazy reminder and stays open (an
// application's hour-long batch import: intent is written inside its own
// transaction) costs the promoter one re-scan after it ends (schema 46;
// re-scans by every run before), never a loss nor a blocked
// intake or claim: while it is open, intake of other reminders completes
// at once, runs complete and claim what is due (a lazy reminder committed
// meanwhile too), the final watermark stays where it was and the final-age
// gauge shows it; after its commit the next run promotes and claims its
// reminder, and no run claims it again. After every run no committed
// reminder lies below the final watermark without its state row. A
// promoter that moved final past the open writer's reminder (forcing its
// writers "done") leaves that reminder below final without a state row
// after the commit, and never claims it: both are asserted.
func TestRunUnderLongWebTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.lazyHorizon(t, "2 hours")
	request := func(key string, due time.Time) intake.Request {
		return intake.Request{Tenant: "acme", Key: key, Channel: reminder.SMS, Recipient: "+14155550100",
			Template: "course-expiry", DueAt: due, Deadline: due.Add(24 * time.Hour)}
	}

	web, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer web.Rollback(ctx) //nolint:errcheck
	_, err = intake.ScheduleMany(ctx, web, []intake.Request{request("web-0", b.now.Add(2*time.Hour+10*time.Minute))})
	require.NoError(t, err)

	// (a) Intake beside it is not blocked: a lazy reminder and one due now.
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	started := time.Now()
	out, err := intake.ScheduleMany(ictx, b.db.Pool, []intake.Request{request("other-0", b.now.Add(2*time.Hour+5*time.Minute)),
		request("due-0", b.now.Add(-time.Minute))})
	require.NoError(t, err, "intake beside an open web transaction")
	require.Less(t, time.Since(started), 5*time.Second)
	for _, o := range out {
		require.Equal(t, intake.Created, o.Status)
	}
	require.Equal(t, "none", b.stateOf(t, "other-0"), "lazy")
	// Passes reach H ahead of the database's clock, at most the horizon:
	// widened so that runs at a fake clock two hours on reach the reminders
	// now (as TestRunPromotesThenClaimsNothingEarly).
	b.lazyHorizon(t, "4 hours")

	reg := prometheus.NewRegistry()
	at := b.now.Add(2*time.Hour + 15*time.Minute)
	f := clock.NewFake(at)
	reg.MustRegister(metrics.NewDBCollector(b.db.Pool, f))
	d := b.dispatcher(b.mq.URL, b.mq.Topology, f, dispatch.Config{PromoteAhead: 3 * time.Hour})
	enqueued := 0
	runOnce := func() dispatch.Summary {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		sum, err := d.RunOnce(rctx)
		require.NoError(t, err)
		enqueued += sum.Enqueued
		// (e) No committed reminder below final without its state row.
		var lost int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminders r, nudge_promoter p
			WHERE r.due_at < p.final_until AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)`).Scan(&lost))
		require.Zero(t, lost, "committed reminders below the final watermark %s without a state row", sum.Final)
		return sum
	}
	finalAge := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "nudge_promoter_final_age_seconds" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no nudge_promoter_final_age_seconds")
		return 0
	}

	// (b), (c) Runs with the web transaction open complete, claim what is
	// due, and leave final where it was.
	sum := runOnce()
	require.EqualValues(t, 1, sum.Promoted, "the committed lazy reminder")
	require.Equal(t, 2, sum.Enqueued, "what is due is claimed")
	require.Equal(t, "enqueued", b.stateOf(t, "other-0"))
	require.Equal(t, "enqueued", b.stateOf(t, "due-0"))
	// Final may reach the provisional end that the schema's migration left
	// (before the web transaction began), not the web reminder's due time.
	f0 := sum.Final
	require.True(t, f0.Before(b.now.Add(time.Hour)), "final %s", f0)
	for range 2 {
		f.Advance(time.Minute)
		sum = runOnce()
		require.Zero(t, sum.Promoted)
		require.Zero(t, sum.Claimed)
		require.True(t, sum.Final.Equal(f0), "the web transaction is open: final stays (%s)", sum.Final)
		var promoted bool
		require.NoError(t, web.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM reminder_state s JOIN reminders r
			ON r.id = s.id WHERE r.key = 'web-0')`).Scan(&promoted))
		require.False(t, promoted, "invisible to the passes, not promoted")
		require.InDelta(t, f.Now().Sub(f0).Seconds(), finalAge(), 1, "the gauge shows final's age")
	}

	// (d) After the commit the next run promotes and claims its reminder,
	// due 7 minutes ago at the fake clock; no run claims it again.
	require.NoError(t, web.Commit(ctx))
	f.Advance(time.Minute)
	sum = runOnce()
	require.EqualValues(t, 1, sum.Promoted, "the web transaction's reminder")
	require.Equal(t, 1, sum.Enqueued)
	require.Equal(t, "enqueued", b.stateOf(t, "web-0"))
	require.True(t, sum.Final.After(f0), "final moves once its writer is gone: %s", sum.Final)
	f.Advance(time.Minute)
	sum = runOnce()
	require.Zero(t, sum.Promoted)
	require.Zero(t, sum.Claimed)
	require.Equal(t, 3, enqueued, "each reminder enqueued once")
	require.Equal(t, map[reminder.State]int{reminder.Enqueued: 3}, b.states(t))
	_, messages := b.confirmed(t)
	require.Equal(t, 3, messages, "one message per reminder")
	require.Less(t, finalAge(), 1.0, "final is ahead of the clock again")
}

// passedAt is when the promoter's last pass saved the watermark.
func (b bundle) passedAt(t *testing.T) time.Time {
	t.Helper()
	var at time.Time // the epoch: no pass yet
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT coalesce(passed_at, 'epoch') FROM nudge_promoter`).Scan(&at))
	return at
}

// A loop's pass runs no promoter pass of its own only within PromoteEvery
// of the last one that completed its sweep, and only while its cutoff is
// below that sweep's final watermark; such a pass still claims what is due.
// At final (where a lazy reminder may lack its state row) it promotes
// first, however recent the last pass. The clock is a fake one, moved.
func TestRunSkipsPromoterPassOnlyBelowFinal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	t0 := b.now
	f := clock.NewFake(t0)
	d := b.dispatcher(b.mq.URL, b.mq.Topology, f, dispatch.Config{PromoteAhead: 10 * time.Second})
	pass := func(at time.Time) (dispatch.Summary, bool) {
		t.Helper()
		f.Set(at)
		before := b.passedAt(t)
		sum, err := d.RunOnce(ctx)
		require.NoError(t, err)
		return sum, !b.passedAt(t).Equal(before)
	}

	_, promoted := pass(t0)
	require.True(t, promoted, "the first pass promotes")
	_, promoted = pass(t0.Add(100 * time.Millisecond))
	require.True(t, promoted, "final is still the schema's initial one, behind the cutoff: the pass promotes")
	b.scheduleAt(t, "due", t0.Add(150*time.Millisecond))
	sum, promoted := pass(t0.Add(200 * time.Millisecond))
	require.False(t, promoted, "within a second of a complete sweep, below final: no promoter pass")
	require.Equal(t, 1, sum.Enqueued, "the skipped pass claims what is due")
	require.True(t, sum.Final.After(t0.Add(200*time.Millisecond)), "it reports the last pass's final: %s", sum.Final)
	_, promoted = pass(t0.Add(1100 * time.Millisecond))
	require.True(t, promoted, "a second after the last promoter pass: the pass promotes")

	// PromoteEvery an hour: only final decides.
	d = b.dispatcher(b.mq.URL, b.mq.Topology, f, dispatch.Config{PromoteAhead: 10 * time.Second, PromoteEvery: time.Hour})
	sum, promoted = pass(t0.Add(1200 * time.Millisecond))
	require.True(t, promoted, "a new dispatcher has no pass of its own to go by")
	final := sum.Final
	require.True(t, final.After(t0.Add(1200*time.Millisecond)), "final %s", final)
	_, promoted = pass(final.Add(-time.Microsecond))
	require.False(t, promoted, "just below final: no promoter pass")
	_, promoted = pass(final)
	require.True(t, promoted, "at final a lazy reminder due then may lack its state row: the pass promotes first")

	// Negative: the promoter before every claim, as before.
	d = b.dispatcher(b.mq.URL, b.mq.Topology, f, dispatch.Config{PromoteAhead: 10 * time.Second, PromoteEvery: -1})
	for i := range 3 {
		_, promoted = pass(final.Add(time.Duration(i) * time.Millisecond))
		require.True(t, promoted, "pass %d", i)
	}
}
