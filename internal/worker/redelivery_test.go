package worker_test

import (
	"context"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Inventory: the broker closes every connection mid-run. The worker goes
// not-ready, reconnects, re-declares, resumes, and nothing is lost or sent
// twice (deliveries of the dead channel are never acked on the new one;
// their redeliveries are absorbed by the fence).
//
// Also with envelopes (issue 18); TestEnvelopeKilledMidwayIsSplitAndNothingSentTwice
// closes the connection while an envelope is surely half done.
func TestWorkerSurvivesTheBrokerClosingItsConnections(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1, 50} {
		t.Run("envelope size "+strconv.Itoa(size), func(t *testing.T) {
			t.Parallel()
			testWorkerSurvivesClosedConnections(t, size)
		})
	}
}

func testWorkerSurvivesClosedConnections(t *testing.T, envelopeSize int) {
	b := setup(t, worker.Config{})
	b.disp.Config.EnvelopeSize = envelopeSize
	require.NoError(t, b.sms.SetConfig(fakesms.Config{Delay: 20 * time.Millisecond}))
	var ids []int64
	for i := range 300 {
		ids = append(ids, b.schedule(t, "k"+strconv.Itoa(i), time.Hour))
	}
	b.dispatch(t)

	var mu sync.Mutex
	sawNotReady := false
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go func() {
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if !b.worker.Ready() {
				mu.Lock()
				sawNotReady = true
				mu.Unlock()
			}
		}
	}()
	for round := range 2 {
		require.Eventually(t, func() bool { return len(b.sms.Messages()) > 50*(round+1) }, 30*time.Second, 5*time.Millisecond)
		require.Eventually(t, b.worker.Ready, 10*time.Second, 5*time.Millisecond)
		mu.Lock()
		sawNotReady = false
		mu.Unlock()
		require.Positive(t, testenv.CloseConnections(t, "w-"+b.mq.Topology.Prefix))
		require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return sawNotReady }, 5*time.Second, time.Millisecond,
			"readiness must report the lost connection")
	}
	for _, id := range ids {
		b.waitState(t, id, reminder.Delivered)
	}
	require.Eventually(t, b.worker.Ready, 10*time.Second, 5*time.Millisecond, "ready again after reconnecting")
	require.Len(t, b.sms.Messages(), 300)
	require.Len(t, b.sms.Attempts(), 300, "no reminder was sent twice")
}

// Inventory: the reminder changes while its message waits (a newer version:
// new due and deadline times). The queued message is superseded; the
// reminder is sent once, for the new version.
func TestRescheduledWhileQueuedSendsTheNewVersionOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	b.stop(t)
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t) // message for the old version in the queue
	ctx := context.Background()
	now := b.clock.Now()
	st, err := intake.Reschedule(ctx, b.db.Pool, "acme", "k", now.Add(-time.Second), now.Add(2*time.Hour), "app", "course end moved")
	require.NoError(t, err)
	require.Equal(t, reminder.Pending, st)
	b.dispatch(t) // message for the new version

	w2, err := worker.New(worker.Config{Channel: reminder.SMS}, worker.Deps{AMQPURL: b.mq.URL, Topology: b.mq.Topology,
		Store: b.st, Sender: mustSMS(t, b), Keys: b.keys, Clock: b.clock, Log: b.log})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = w2.Run(wctx) }()
	r := b.waitState(t, id, reminder.Delivered)
	require.WithinDuration(t, now.Add(2*time.Hour), r.Deadline, time.Millisecond)
	require.Eventually(t, func() bool { return w2.Counts().Duplicates == 1 }, 10*time.Second, 10*time.Millisecond,
		"the old version's message was discarded")
	require.Len(t, b.sms.Attempts(), 1)

	_, err = intake.Reschedule(ctx, b.db.Pool, "acme", "k", now, now.Add(-time.Hour), "app", "bad")
	var verr *intake.ValidationError
	require.ErrorAs(t, err, &verr)
	require.Equal(t, "deadline", verr.Field)
}

func mustSMS(t *testing.T, b *bundle) provider.Sender {
	t.Helper()
	hs := httptest.NewServer(b.sms)
	t.Cleanup(hs.Close)
	c, err := sms.New(sms.Config{URL: hs.URL})
	require.NoError(t, err)
	return c
}

// getQueued takes the SMS queue's first message without acking it; the
// caller settles it.
func (b bundle) getQueued(t *testing.T) amqp.Delivery {
	t.Helper()
	conn, err := broker.Dial(b.mq.URL, "copier")
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	var d amqp.Delivery
	require.Eventually(t, func() bool {
		var ok bool
		d, ok, err = ch.Get(b.mq.Topology.Queue("sms"), false)
		require.NoError(t, err)
		return ok
	}, 5*time.Second, 10*time.Millisecond)
	return d
}

// Inventory: the same message is delivered twice (a publisher retry, a
// broker redelivery). One claim, one send.
func TestDuplicateDeliveryOfOneMessageSendsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	b.stop(t)
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	// Copy the queued message, so the queue holds it twice.
	d := b.getQueued(t)
	b.publishRaw(t, d.MessageId, d.Body, d.Headers)
	require.NoError(t, d.Nack(false, true))

	w2, err := worker.New(worker.Config{Channel: reminder.SMS}, worker.Deps{AMQPURL: b.mq.URL, Topology: b.mq.Topology,
		Store: b.st, Sender: mustSMS(t, b), Keys: b.keys, Clock: b.clock, Log: b.log})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w2.Run(ctx) }()
	b.waitState(t, id, reminder.Delivered)
	require.Eventually(t, func() bool { return w2.Counts().Duplicates == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Len(t, b.sms.Attempts(), 1)
	var attempts int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM delivery_attempts WHERE reminder_id = $1`, id).Scan(&attempts))
	require.Equal(t, 1, attempts)
}

// Two copies of one message in the same batch (a publisher retry published
// it twice): the one statement that reads and claims the batch claims once,
// and only one copy is sent.
func TestTwoCopiesInOneBatchSendOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	b.stop(t)
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	d := b.getQueued(t)
	// Two first deliveries of the same message replace the original.
	b.publishRaw(t, d.MessageId, d.Body, d.Headers)
	b.publishRaw(t, d.MessageId, d.Body, d.Headers)
	require.NoError(t, d.Ack(false))

	w2, err := worker.New(worker.Config{Channel: reminder.SMS, BatchWait: 500 * time.Millisecond},
		worker.Deps{AMQPURL: b.mq.URL, Topology: b.mq.Topology, Store: b.st, Sender: mustSMS(t, b), Keys: b.keys,
			Clock: b.clock, Log: b.log})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w2.Run(ctx) }()
	b.waitState(t, id, reminder.Delivered)
	require.Eventually(t, func() bool { return w2.Counts().Duplicates == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Len(t, b.sms.Attempts(), 1)
}

// Inventory: the clock passes the deadline while the message waits in the
// work queue. The worker expires it; nothing is sent.
func TestDeadlinePassesWhileQueued(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	b.stop(t)
	id := b.schedule(t, "k", time.Minute)
	b.dispatch(t)
	b.clock.Advance(time.Minute) // exactly the deadline
	w2, err := worker.New(worker.Config{Channel: reminder.SMS}, worker.Deps{AMQPURL: b.mq.URL, Topology: b.mq.Topology,
		Store: b.st, Sender: mustSMS(t, b), Keys: b.keys, Clock: b.clock, Log: b.log})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w2.Run(ctx) }()
	r := b.waitState(t, id, reminder.Expired)
	require.Equal(t, "deadline reached before the send started", r.Reason)
	require.Empty(t, b.sms.Attempts())
}

// A message with no fleet-wide capacity is not waited for: it is deferred
// through a retry tier and sent when its token is due, or, when that is past
// its deadline, expired as rate_limited. Nothing is sent beyond the limit.
func TestRateLimitedMessagesAreDeferredOrExpired(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	b.stop(t)
	ctx := context.Background()
	now := b.clock.Now()
	sched := func(key string, deadline time.Duration) int64 {
		res, err := intake.Schedule(ctx, b.db.Pool, intake.Request{Tenant: "acme", Key: key, Channel: reminder.SMS,
			Recipient: "+14155550100", Template: "course-expiry", DueAt: now.Add(-time.Second), Deadline: now.Add(deadline)})
		require.NoError(t, err)
		return res.ID
	}
	first := sched("first", time.Hour)
	tooLate := sched("too-late", 1500*time.Millisecond)
	later := sched("later", time.Hour)
	b.dispatch(t)

	cfg, err := ratelimit.Parse([]byte(`{"version":"t","channels":{"sms":{"account":"a","rate":0.5,"burst":1}}}`))
	require.NoError(t, err)
	w2, err := worker.New(worker.Config{Channel: reminder.SMS, BatchWait: 200 * time.Millisecond},
		worker.Deps{AMQPURL: b.mq.URL, Topology: b.mq.Topology, Store: b.st, Sender: mustSMS(t, b), Keys: b.keys,
			Clock: b.clock, Log: b.log, Limiter: ratelimit.New(b.db.Pool, cfg)})
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = w2.Run(wctx) }()

	b.waitState(t, first, reminder.Delivered)
	r := b.waitState(t, tooLate, reminder.Expired)
	require.Equal(t, "rate_limited: no capacity before the deadline", r.Reason)
	b.waitState(t, later, reminder.Delivered)
	atts := b.sms.Attempts()
	require.Len(t, atts, 2, "the expired one was never sent")
	require.GreaterOrEqual(t, atts[1].Time.Sub(atts[0].Time), 1800*time.Millisecond, "the second send waited for its token")
	require.Positive(t, w2.Counts().Deferred)
}
