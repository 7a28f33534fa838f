package reconcile_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/metrics/metricstest"
	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/internal/retention"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

type bundle struct {
	db    *testenv.DB
	mq    *testenv.Broker
	st    *store.Store
	keys  *message.Keyring
	clock *clock.Fake
	enq   dispatch.Enqueuer
	rec   *reconcile.Reconciler
	ch    *amqp.Channel
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{db: testenv.Postgres(t), mq: testenv.RabbitMQ(t), clock: clock.NewFake(time.Now())}
	b.st = store.New(b.db.Pool)
	var err error
	b.keys, err = message.ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)
	pub := broker.NewPublisher(b.mq.URL, b.mq.Topology, "test")
	t.Cleanup(pub.Close)
	b.enq = dispatch.Enqueuer{Store: b.st, Publisher: pub, Keys: b.keys, Topology: b.mq.Topology, Clock: b.clock, Actor: "test"}
	rec := b.enq
	rec.Actor = "reconciler"
	b.rec = &reconcile.Reconciler{Enqueuer: rec, Config: reconcile.Config{Overdue: time.Minute, Lease: time.Minute},
		Log: zerolog.Nop()}
	conn, err := broker.Dial(b.mq.URL, "reader")
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	b.ch, err = conn.Channel()
	require.NoError(t, err)
	return b
}

func (b *bundle) schedule(t *testing.T, key string, deadline time.Duration) int64 {
	t.Helper()
	now := b.clock.Now()
	res, err := intake.Schedule(context.Background(), b.db.Pool, intake.Request{Tenant: "acme", Key: key,
		Channel: reminder.SMS, Recipient: "+14155550100", Template: "course-expiry",
		DueAt: now.Add(-time.Second), Deadline: now.Add(deadline)})
	require.NoError(t, err)
	return res.ID
}

func (b *bundle) get(t *testing.T, id int64) reminder.Reminder {
	t.Helper()
	r, err := intake.Get(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	return r
}

// republishes is how often the reconciler republished the reminder.
func (b *bundle) republishes(t *testing.T, id int64) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT republishes FROM reminder_state WHERE id = $1`, id).Scan(&n))
	return n
}

// queued returns the envelopes waiting in the SMS work queue, consuming them.
func (b *bundle) queued(t *testing.T) []message.Envelope {
	t.Helper()
	var out []message.Envelope
	for {
		d, ok, err := b.ch.Get(b.mq.Topology.Queue("sms"), true)
		require.NoError(t, err)
		if !ok {
			return out
		}
		env, err := b.keys.Open(d.Body, d.Headers)
		require.NoError(t, err)
		out = append(out, env)
	}
}

func (b *bundle) dispatch(t *testing.T) {
	t.Helper()
	now := b.clock.Now()
	claimed, err := b.st.ClaimDue(context.Background(), now, now, 100, time.Minute, "d")
	require.NoError(t, err)
	_, err = b.enq.Enqueue(context.Background(), claimed)
	require.NoError(t, err)
}

func TestRepublishesAMessageThatWasLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	lost := b.queued(t) // the message vanishes (a purged queue, a broker that lost it)
	require.Len(t, lost, 1)

	sum, err := b.rec.Pass(context.Background())
	require.NoError(t, err)
	require.Zero(t, sum.Republished, "not overdue yet")

	b.clock.Advance(2 * time.Minute)
	sum, err = b.rec.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, sum.Republished)
	again := b.queued(t)
	require.Len(t, again, 1)
	r := b.get(t, id)
	require.Equal(t, reminder.Enqueued, r.State)
	require.Equal(t, r.Fence, again[0].Fence)
	require.Greater(t, again[0].Fence, lost[0].Fence, "the old message, if it resurfaces, is superseded")
	require.Equal(t, lost[0].IdempotencyKey, again[0].IdempotencyKey)
}

func TestRecoversASendWhoseWorkerDied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	msg := b.queued(t)[0]
	// A worker claims the attempt, then dies before recording anything.
	_, err := b.st.ClaimAttempts(context.Background(), b.clock.Now(),
		[]store.Fenced{{ID: id, Fence: msg.Fence}}, 30*time.Second, "doomed-worker")
	require.NoError(t, err)

	b.clock.Advance(10 * time.Second)
	sum, err := b.rec.Pass(context.Background())
	require.NoError(t, err)
	require.Zero(t, sum.Republished, "the send lease is still live")

	b.clock.Advance(time.Minute)
	sum, err = b.rec.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, sum.Republished)
	r := b.get(t, id)
	require.Equal(t, reminder.Enqueued, r.State)
	require.Equal(t, 1, r.Attempts, "the interrupted attempt counts against the budget")
	require.Len(t, b.queued(t), 1)
}

func TestReleasesDeadLeasesAndExpiresLateWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// A dispatcher claims one batch, publishes it, records the broker's
	// confirmation and moves on.
	queued := b.schedule(t, "queued", time.Hour)
	first, err := b.st.ClaimDue(ctx, b.clock.Now(), b.clock.Now(), 100, 20*time.Second, "dispatcher")
	require.NoError(t, err)
	require.Len(t, first, 1)
	require.NoError(t, b.st.ConfirmPublished(ctx, b.clock.Now(), map[int64]int{first[0].Batch: 1}, "dispatcher"))
	// Another claims two more and dies before publishing.
	held := b.schedule(t, "held", time.Hour)
	late := b.schedule(t, "late", 30*time.Second)
	_, err = b.st.ClaimDue(ctx, b.clock.Now(), b.clock.Now(), 100, 20*time.Second, "dead-dispatcher")
	require.NoError(t, err)

	// Past the leases (20 s) and late's deadline (30 s), within the overdue
	// window (1 minute) of the queued message.
	b.clock.Advance(40 * time.Second)
	sum, err := b.rec.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, sum.Expired)
	require.Equal(t, 1, sum.Released)
	require.Equal(t, 1, sum.InQueue)
	require.Zero(t, sum.Republished)
	require.Equal(t, reminder.Pending, b.get(t, held).State)
	r := b.get(t, late)
	require.Equal(t, reminder.Expired, r.State)
	require.Equal(t, "deadline passed while enqueued", r.Reason)
	r = b.get(t, queued)
	require.Equal(t, reminder.Enqueued, r.State, "its message is in the queue: not published again")
	require.Equal(t, first[0].Fence, r.Fence)
	require.Empty(t, b.queued(t), "nothing republished")

	// A second pass finds nothing: repair is idempotent.
	sum, err = b.rec.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, reconcile.Summary{Elapsed: sum.Elapsed}, sum)
}

type countingCleaner struct{ passes atomic.Int32 }

func (c *countingCleaner) Pass(context.Context) (retention.Summary, error) {
	c.passes.Add(1)
	return retention.Summary{}, nil
}

// The loop's pauses, its retention cadence and its readiness all follow the
// injected clock: the test moves a fake clock and never sleeps.
func TestLoopWaitsOnTheClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	require.Len(t, b.queued(t), 1, "the message is lost")
	cleaner := &countingCleaner{}
	b.rec.Cleaner, b.rec.CleanEvery = cleaner, time.Minute
	const every = 10 * time.Second
	ready := b.rec.Ready(every)
	require.False(t, ready(), "no pass yet")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.rec.Loop(ctx, every) }()
	waiting := func() {
		t.Helper()
		require.Eventually(t, func() bool { return b.clock.Waiters() == 1 }, 10*time.Second, time.Millisecond,
			"the loop pauses on the clock after each pass")
	}

	waiting()
	require.True(t, ready())
	require.EqualValues(t, 1, cleaner.passes.Load(), "retention runs after the first pass")
	require.Empty(t, b.queued(t), "not overdue yet")

	b.clock.Advance(2 * time.Minute) // past Overdue (1 minute) and CleanEvery
	waiting()
	require.Len(t, b.queued(t), 1, "the next pass republished the lost message")
	require.EqualValues(t, 2, cleaner.passes.Load())

	b.clock.Advance(every)
	waiting()
	require.EqualValues(t, 2, cleaner.passes.Load(), "retention waits for CleanEvery, not every pass")

	cancel()
	require.NoError(t, <-done)
	b.clock.Advance(3*every + 5*time.Second)
	require.False(t, ready(), "no pass for over three intervals: not ready")
}

// Issue 13, finding 7: the reconciler republished a message overdue for 10
// minutes and quarantined it after three republishes, so a 40-minute worker
// outage quarantined healthy work. Now a channel whose work queue has a
// backlog or no consumer is waiting, not losing: its enqueued reminders are
// left alone however long that lasts, while a send whose worker died (an
// expired send lease) is still republished. Once the queue has a consumer
// and is drained, a message overdue then is lost and republished.
func TestBacklogWithoutConsumerIsWaitingNotLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	queues := &broker.WorkQueues{URL: b.mq.URL, Topology: b.mq.Topology}
	t.Cleanup(queues.Close)
	b.rec.Queues = queues.States
	var ids []int64
	for _, k := range []string{"a", "b", "c"} {
		ids = append(ids, b.schedule(t, k, 24*time.Hour))
	}
	crashed := b.schedule(t, "crashed", 24*time.Hour)
	b.dispatch(t)
	// A worker claimed one and died: its row is sending under a send lease.
	_, err := b.st.ClaimAttempts(ctx, b.clock.Now(), []store.Fenced{{ID: crashed, Fence: b.get(t, crashed).Fence}},
		30*time.Second, "doomed")
	require.NoError(t, err)

	// No consumer for 5 × Overdue, a pass every half Overdue.
	republished := 0
	for range 10 {
		b.clock.Advance(30 * time.Second)
		sum, err := b.rec.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, []string{"email", "sms", "webhook"}, sum.Waiting, "email, webhook: no consumer; sms: a backlog and no consumer")
		require.Zero(t, sum.Quarantined)
		republished += sum.Republished
	}
	require.Equal(t, 1, republished, "only the send whose worker died")
	for _, id := range ids {
		require.Equal(t, reminder.Enqueued, b.get(t, id).State, "healthy work is not quarantined")
		require.Zero(t, b.republishes(t, id))
	}
	require.Equal(t, reminder.Enqueued, b.get(t, crashed).State)

	// A consumer attaches: every message in the queue is current.
	msgs := b.queued(t)
	require.Len(t, msgs, 5, "the three, the crashed send's first message and its republished one")
	current := 0
	for _, m := range msgs {
		if r := b.get(t, m.ReminderID); r.Fence == m.Fence {
			current++
		}
	}
	require.Equal(t, 4, current, "each reminder has its current message waiting; the crashed send's first is superseded")

	// Drained, with a consumer: what is overdue now was lost, and is republished.
	consumer, err := b.ch.Consume(b.mq.Topology.Queue("sms"), "test-consumer", false, false, false, false, nil)
	require.NoError(t, err)
	b.clock.Advance(2 * time.Minute)
	sum, err := b.rec.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"email", "webhook"}, sum.Waiting)
	require.Equal(t, 4, sum.Republished)
	for range 4 {
		select {
		case <-consumer:
		case <-time.After(10 * time.Second):
			t.Fatal("republished message not delivered to the consumer")
		}
	}
}

// Issue 13, finding 7: with the broker down the reconciler exited at start,
// so expiry stopped too. Now a pass that cannot publish still expires and
// resolves leases, reclaims nothing (a reclaim it could not publish would
// spend a republish), and says so in its summary, its error and readiness.
func TestBrokerDownPassDoesTheDatabaseWorkOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	overdue := b.schedule(t, "overdue", time.Hour)
	b.dispatch(t)
	require.Len(t, b.queued(t), 1, "its message is lost")
	late := b.schedule(t, "late", 30*time.Second)
	var down atomic.Bool
	down.Store(true)
	b.rec.BrokerReady = func(context.Context) error {
		if down.Load() {
			return errors.New("connection refused")
		}
		return nil
	}

	const every = 10 * time.Second
	ready := b.rec.Ready(every)
	loopCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.clock.Advance(2 * time.Minute) // past late's deadline and overdue's Overdue
	go func() { done <- b.rec.Loop(loopCtx, every) }()
	require.Eventually(t, func() bool { return b.clock.Waiters() == 1 }, 10*time.Second, time.Millisecond)
	require.Equal(t, reminder.Expired, b.get(t, late).State, "expiry goes on without the broker")
	require.Equal(t, reminder.Enqueued, b.get(t, overdue).State)
	require.Zero(t, b.republishes(t, overdue), "nothing reclaimed for a publish that cannot happen")
	require.False(t, ready(), "not ready while the broker is unreachable")

	sum, err := b.rec.Pass(ctx)
	require.ErrorIs(t, err, dispatch.ErrBrokerUnavailable)
	require.True(t, sum.BrokerDown)

	down.Store(false)
	b.clock.Advance(every)
	require.Eventually(t, func() bool { return b.clock.Waiters() == 1 && ready() }, 10*time.Second, time.Millisecond)
	require.Equal(t, 1, b.republishes(t, overdue), "republished once the broker is back")
	cancel()
	require.NoError(t, <-done)
}

// ticking is a clock that moves a second at every reading, so a pass that
// reads it takes time.
type ticking struct{ *clock.Fake }

func (c ticking) Now() time.Time { c.Advance(time.Second); return c.Fake.Now() }

// Issue 17: the reconciler counted its expiries as
// nudge_deadline_misses_total{channel=""} (the deadline-miss alert's summary
// named no channel), never counted an expired send lease, and reported every
// pass as taking 0 s (Elapsed was set on a copy of the result). Now
// expiries carry their channel, a send lease that ran out is counted
// (republished or expired), and a pass takes the time it took.
func TestPassMetricsNameTheChannelAndTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	b.rec.Metrics = metrics.NewFor(reg, metrics.Reconciler, "email", "sms")
	before := metricstest.Values(t, reg)
	for _, k := range []string{`nudge_deadline_misses_total{channel="email"}`, `nudge_deadline_misses_total{channel="sms"}`,
		`nudge_lease_expirations_total{lease="dispatch"}`, `nudge_lease_expirations_total{lease="send"}`,
		`nudge_outcomes_total{channel="sms",outcome="expired",reason="deadline_passed"}`} {
		require.Contains(t, before, k, "known at start")
		require.Zero(t, before[k], k)
	}

	// Two sends whose worker died: one past its deadline by the time the
	// lease runs out (expired), one not (republished).
	late := b.schedule(t, "late", 30*time.Second)
	live := b.schedule(t, "live", time.Hour)
	b.dispatch(t)
	var fs []store.Fenced
	for _, env := range b.queued(t) {
		fs = append(fs, store.Fenced{ID: env.ReminderID, Fence: env.Fence})
	}
	require.Len(t, fs, 2)
	_, err := b.st.ClaimAttempts(ctx, b.clock.Now(), fs, 10*time.Second, "doomed-worker")
	require.NoError(t, err)
	b.clock.Advance(time.Minute)

	b.rec.Clock = ticking{b.clock}
	sum, err := b.rec.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, map[reminder.Channel]int{reminder.SMS: 1}, sum.ExpiredBy)
	require.Equal(t, 1, sum.Republished)
	require.Equal(t, 2, sum.SendLeasesExpired)
	require.Positive(t, sum.Elapsed, "the pass read a moving clock")
	require.Equal(t, reminder.Expired, b.get(t, late).State)
	require.Equal(t, reminder.Enqueued, b.get(t, live).State)

	b.rec.Record(sum, err, b.clock.Now())
	after := metricstest.Values(t, reg)
	require.Equal(t, 1.0, after[`nudge_deadline_misses_total{channel="sms"}`])
	require.Equal(t, 1.0, after[`nudge_outcomes_total{channel="sms",outcome="expired",reason="deadline_passed"}`])
	require.NotContains(t, after, `nudge_deadline_misses_total{channel=""}`)
	require.Equal(t, 2.0, after[`nudge_lease_expirations_total{lease="send"}`])
	require.Equal(t, 1.0, after[`nudge_reconcile_pass_duration_seconds_count{result="ok"}`])
	require.Equal(t, sum.Elapsed.Seconds(), after[`nudge_reconcile_pass_duration_seconds_sum{result="ok"}`])
	require.NotContains(t, after, `nudge_hop_latency_seconds_count{channel="sms",hop="claim_to_enqueue"}`,
		"the reconciler's hops are the dispatcher's, from dispatch_runs")
}
