package dispatch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
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
