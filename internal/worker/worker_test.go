package worker_test

import (
	"context"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// bundle is one SMS worker on real PostgreSQL and RabbitMQ, sending to the
// fake provider, with a clock the test can move ahead.
type bundle struct {
	db     *testenv.DB
	mq     *testenv.Broker
	st     *store.Store
	sms    *fakesms.Server
	clock  *clock.Shifted
	keys   *message.Keyring
	disp   *dispatch.Dispatcher
	worker *worker.Worker
	cancel context.CancelFunc
	done   chan error
	log    zerolog.Logger
}

// setup starts the worker; wrap, if given, decorates its sender (to plant a bug).
func setup(t *testing.T, cfg worker.Config, wrap ...func(provider.Sender) provider.Sender) *bundle {
	t.Helper()
	b := &bundle{db: testenv.Postgres(t), sms: fakesms.New(), clock: &clock.Shifted{}}
	b.mq = testenv.RabbitMQ(t)
	b.st = store.New(b.db.Pool)
	// Short tiers so retries come back within the test.
	b.mq.Topology.RetryTiers = []time.Duration{200 * time.Millisecond, time.Second, 2 * time.Second}
	require.NoError(t, b.declare())
	var err error
	b.keys, err = message.ParseKeys("test:0123456789abcdef0123")
	require.NoError(t, err)
	b.log = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	hs := httptest.NewServer(b.sms)
	t.Cleanup(hs.Close)
	client, err := sms.New(sms.Config{URL: hs.URL, Timeout: 5 * time.Second})
	require.NoError(t, err)

	b.disp = &dispatch.Dispatcher{Enqueuer: dispatch.Enqueuer{
		Store: b.st, Publisher: broker.NewPublisher(b.mq.URL, b.mq.Topology, "dispatcher"), Keys: b.keys,
		Topology: b.mq.Topology, Clock: b.clock, Actor: "dispatcher",
	}, Log: b.log}

	cfg.Channel = reminder.SMS
	if cfg.Name == "" {
		cfg.Name = "w-" + b.mq.Topology.Prefix // unique: tests close their own connections by name
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = 100 * time.Millisecond
	}
	var sender provider.Sender = client
	for _, wr := range wrap {
		sender = wr(sender)
	}
	b.worker, err = worker.New(cfg, worker.Deps{AMQPURL: b.mq.URL, Topology: b.mq.Topology, Store: b.st,
		Sender: sender, Keys: b.keys, Clock: b.clock, Log: b.log, Rand: func() float64 { return 0.5 }})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel, b.done = cancel, make(chan error, 1)
	go func() { b.done <- b.worker.Run(ctx) }()
	t.Cleanup(func() { b.stop(t) })
	return b
}

func (b *bundle) declare() error {
	conn, err := broker.Dial(b.mq.URL, "test")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return b.mq.Topology.WithDefaults().Declare(ch)
}

var stopOnce sync.Map

func (b *bundle) stop(t *testing.T) {
	if _, done := stopOnce.LoadOrStore(b, true); done {
		return
	}
	b.cancel()
	select {
	case err := <-b.done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("worker did not stop")
	}
}

func (b *bundle) schedule(t *testing.T, key string, deadline time.Duration) int64 {
	t.Helper()
	now := b.clock.Now()
	res, err := intake.Schedule(context.Background(), b.db.Pool, intake.Request{
		Tenant: "acme", Key: key, Channel: reminder.SMS, Recipient: "+14155550100", Template: "course-expiry",
		DueAt: now.Add(-time.Second), Deadline: now.Add(deadline),
	})
	require.NoError(t, err)
	return res.ID
}

func (b *bundle) dispatch(t *testing.T) {
	t.Helper()
	_, err := b.disp.RunOnce(context.Background())
	require.NoError(t, err)
}

func (b *bundle) waitState(t *testing.T, id int64, want reminder.State) reminder.Reminder {
	t.Helper()
	var r reminder.Reminder
	require.Eventually(t, func() bool {
		var err error
		r, err = intake.Get(context.Background(), b.db.Pool, id)
		require.NoError(t, err)
		return r.State == want
	}, 20*time.Second, 20*time.Millisecond, "reminder %d never reached %s (last %s: %s)", id, want, r.State, r.Reason)
	return r
}

func (b *bundle) events(t *testing.T, id int64) []reminder.Event {
	t.Helper()
	evs, err := intake.Events(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	return evs
}

func TestRetryableFailuresThenDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	require.NoError(t, b.sms.SetConfig(fakesms.Config{RetryAfterSeconds: 1, Script: []fakesms.Outcome{"503", "429"}}))
	id := b.schedule(t, "k", time.Hour)
	start := time.Now()
	b.dispatch(t)

	r := b.waitState(t, id, reminder.Delivered)
	require.Equal(t, 3, r.Attempts)
	require.Contains(t, r.LastError, "http_429")
	// The 429's Retry-After (1s) outweighs the 200ms backoff: the third
	// attempt waited at least a second after the second.
	attempts := b.sms.Attempts()
	require.Len(t, attempts, 3)
	require.GreaterOrEqual(t, attempts[2].Time.Sub(attempts[1].Time), time.Second)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Len(t, b.sms.Messages(), 1)

	var trail []reminder.State
	for _, e := range b.events(t, id) {
		trail = append(trail, e.To)
	}
	require.Equal(t, []reminder.State{reminder.Pending, reminder.Enqueued, reminder.Sending,
		reminder.Retrying, reminder.Sending, reminder.Retrying, reminder.Sending, reminder.Delivered}, trail)
}

func TestPermanentFailureEndsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	require.NoError(t, b.sms.Enqueue("400"))
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	r := b.waitState(t, id, reminder.Failed)
	require.Equal(t, "permanent failure: http_400", r.Reason)
	require.Equal(t, 1, r.Attempts)
	require.Empty(t, b.sms.Messages())
	require.Len(t, b.sms.Attempts(), 1, "a permanent failure is not retried")
}

func TestTimeoutAfterAcceptIsDeliveredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{SendTimeout: 300 * time.Millisecond})
	require.NoError(t, b.sms.SetConfig(fakesms.Config{Stall: 2 * time.Second, Script: []fakesms.Outcome{fakesms.TimeoutAfterAccept}}))
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	r := b.waitState(t, id, reminder.Delivered)
	require.Equal(t, 2, r.Attempts, "the timed-out attempt is retried with the same idempotency key")
	require.Len(t, b.sms.Messages(), 1, "the provider deduplicated the retry: one message reached the phone")
	atts := b.sms.Attempts()
	require.Len(t, atts, 2)
	require.Equal(t, atts[0].IdempotencyKey, atts[1].IdempotencyKey)
	require.True(t, atts[1].Duplicate)
}

func TestAttemptLimitEndsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{MaxAttempts: 2})
	require.NoError(t, b.sms.Enqueue("503", "503", "503"))
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	r := b.waitState(t, id, reminder.Failed)
	require.Equal(t, "attempts exhausted (2): http_503", r.Reason)
	require.Len(t, b.sms.Attempts(), 2)
}

func TestNoRetryScheduledPastDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{BackoffBase: 2 * time.Second})
	require.NoError(t, b.sms.Enqueue("503"))
	id := b.schedule(t, "k", 1500*time.Millisecond) // the next attempt (the 2s tier) would land past it
	b.dispatch(t)
	r := b.waitState(t, id, reminder.Expired)
	require.Equal(t, "deadline would pass before the next attempt: http_503", r.Reason)
	require.Len(t, b.sms.Attempts(), 1)
}

func TestDeadlinePassesWhileWaitingInRetryTier(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{BackoffBase: 800 * time.Millisecond})
	require.NoError(t, b.sms.Enqueue("503"))
	id := b.schedule(t, "k", time.Minute)
	b.dispatch(t)
	b.waitState(t, id, reminder.Retrying)
	// While the message waits in its 1s tier, the clock passes the deadline.
	b.clock.Advance(2 * time.Minute)
	r := b.waitState(t, id, reminder.Expired)
	require.Equal(t, "deadline reached before the send started", r.Reason)
	require.Len(t, b.sms.Attempts(), 1, "nothing is sent after the deadline")
}

func TestCanceledWhileQueuedIsNotSent(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	b.stop(t) // no consumer while we enqueue and cancel
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	st, err := intake.Cancel(context.Background(), b.db.Pool, "acme", "k", "app", "learner left")
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, st)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w2, err := worker.New(worker.Config{Channel: reminder.SMS}, worker.Deps{AMQPURL: b.mq.URL, Topology: b.mq.Topology,
		Store: b.st, Sender: nil, Keys: b.keys, Clock: b.clock, Log: b.log})
	require.NoError(t, err)
	go func() { _ = w2.Run(ctx) }()
	require.Eventually(t, func() bool { return w2.Counts().Superseded == 1 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, reminder.Canceled, b.waitState(t, id, reminder.Canceled).State)
	require.Empty(t, b.sms.Attempts())
}

// publishRaw puts a hand-made message on the SMS work queue.
func (b *bundle) publishRaw(t *testing.T, id string, body []byte, headers amqp.Table) {
	t.Helper()
	pub := broker.NewPublisher(b.mq.URL, b.mq.Topology, "raw")
	defer pub.Close()
	res, err := pub.PublishBatch(context.Background(), []broker.Outgoing{{Exchange: b.mq.Topology.WorkExchange(),
		RoutingKey: "sms", Msg: amqp.Publishing{MessageId: id, Headers: headers, Body: body}}})
	require.NoError(t, err)
	require.NoError(t, res[0])
}

func TestUnverifiableMessagesAreDeadLetteredNotProcessed(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	id := b.schedule(t, "k", time.Hour)
	good, hdr, err := b.keys.Seal(message.Envelope{ReminderID: id, Fence: 0, Channel: "sms"})
	require.NoError(t, err)
	tampered := []byte(string(good[:len(good)-2]) + " }")
	other, err := message.ParseKeys("rogue:fedcba9876543210fedc")
	require.NoError(t, err)
	forgedBody, forgedHdr, err := other.Seal(message.Envelope{ReminderID: id, Channel: "sms"})
	require.NoError(t, err)

	b.publishRaw(t, "unsigned", good, nil)
	b.publishRaw(t, "tampered", tampered, hdr)
	b.publishRaw(t, "forged", forgedBody, forgedHdr)
	b.publishRaw(t, "malformed", []byte("not json"), signedHeaders(b.keys, []byte("not json")))

	dead := b.drainDead(t, 4)
	reasons := map[string]string{}
	for _, d := range dead {
		reasons[d.MessageId] = d.Headers[message.HeaderReason].(string)
		require.EqualValues(t, 1, d.Headers[message.HeaderReceiveCount])
		require.NotEmpty(t, d.Headers[message.HeaderFirstSeen])
	}
	require.Equal(t, "unverifiable: message is not signed", reasons["unsigned"])
	require.Equal(t, "unverifiable: message signature does not verify", reasons["tampered"])
	require.Contains(t, reasons["forged"], "unknown key id")
	require.Contains(t, reasons["malformed"], "malformed")

	r, err := intake.Get(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, reminder.Pending, r.State, "no unverified message touches a reminder")
	require.Empty(t, b.sms.Attempts())
}

func signedHeaders(k *message.Keyring, body []byte) amqp.Table {
	return amqp.Table(message.SignForTest(k, body))
}

// drainDead reads n messages from the SMS dead-letter queue.
func (b *bundle) drainDead(t *testing.T, n int) []amqp.Delivery {
	t.Helper()
	conn, err := broker.Dial(b.mq.URL, "dead-reader")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	var out []amqp.Delivery
	require.Eventually(t, func() bool {
		d, ok, err := ch.Get(b.mq.Topology.DeadQueue("sms"), false)
		require.NoError(t, err)
		if ok {
			out = append(out, d)
			require.NoError(t, d.Ack(false))
		}
		return len(out) >= n
	}, 15*time.Second, 10*time.Millisecond, "dead letters: got %d of %d", len(out), n)
	return out
}

func TestGracefulDrainFinishesInFlightSends(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{Grace: 10 * time.Second})
	require.NoError(t, b.sms.SetConfig(fakesms.Config{Delay: 700 * time.Millisecond}))
	var ids []int64
	for i := range 20 {
		ids = append(ids, b.schedule(t, "k"+strconv.Itoa(i), time.Hour))
	}
	b.dispatch(t)
	require.Eventually(t, func() bool { return len(b.sms.Attempts()) > 0 }, 10*time.Second, 5*time.Millisecond)
	b.stop(t) // SIGTERM with sends in flight

	for _, id := range ids {
		r, err := intake.Get(context.Background(), b.db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, reminder.Delivered, r.State, "in-flight reminder %d finished before exit", id)
	}
	// Everything was acked: the work queue is empty.
	conn, err := broker.Dial(b.mq.URL, "inspect")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(b.mq.Topology.Queue("sms"), true, false, false, false,
		amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	require.Zero(t, q.Messages)
	require.Len(t, b.sms.Messages(), 20)
}

// panicky is a sender with a bug that one recipient triggers.
type panicky struct {
	provider.Sender
	victim string
}

func (p panicky) Send(ctx context.Context, m provider.Message) (string, error) {
	if m.Recipient == p.victim {
		panic("index out of range [3] with length 3")
	}
	return p.Sender.Send(ctx, m)
}

func TestPoisonSendIsQuarantinedWhileHealthyWorkFlows(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{}, func(s provider.Sender) provider.Sender { return panicky{s, "+14155550199"} })
	ctx := context.Background()
	now := b.clock.Now()
	var healthy []int64
	for i := range 20 {
		healthy = append(healthy, b.schedule(t, "ok"+strconv.Itoa(i), time.Hour))
	}
	res, err := intake.Schedule(ctx, b.db.Pool, intake.Request{Tenant: "acme", Key: "poison", Channel: reminder.SMS,
		Recipient: "+14155550199", Template: "course-expiry", DueAt: now.Add(-time.Second), Deadline: now.Add(time.Hour)})
	require.NoError(t, err)
	b.dispatch(t)

	r := b.waitState(t, res.ID, reminder.Quarantined)
	require.Contains(t, r.Reason, "the send panicked")
	for _, id := range healthy {
		b.waitState(t, id, reminder.Delivered)
	}
	dead := b.drainDead(t, 1)
	h := dead[0].Headers
	require.Equal(t, strconv.FormatInt(res.ID, 10), h[message.HeaderReminderID])
	require.Contains(t, h[message.HeaderReason], "panicked")
	require.EqualValues(t, 1, h[message.HeaderReceiveCount])
	require.Equal(t, r.Deadline.UTC().Format(time.RFC3339), h[message.HeaderDeadline])
	require.NotEmpty(t, h[message.HeaderFirstSeen])
	require.Len(t, b.sms.Messages(), 20)
}

func TestMessageRedeliveredTooOftenIsQuarantined(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{PoisonAfter: 3})
	b.stop(t) // consumers that die on it: simulated by giving it back three times
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	conn, err := broker.Dial(b.mq.URL, "crashing-consumer")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for range 3 {
		var d amqp.Delivery
		require.Eventually(t, func() bool {
			var ok bool
			d, ok, err = ch.Get(b.mq.Topology.Queue("sms"), false)
			require.NoError(t, err)
			return ok
		}, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, d.Nack(false, true))
	}

	w2, err := worker.New(worker.Config{Channel: reminder.SMS, PoisonAfter: 3}, worker.Deps{AMQPURL: b.mq.URL,
		Topology: b.mq.Topology, Store: b.st, Sender: nil, Keys: b.keys, Clock: b.clock, Log: b.log})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w2.Run(ctx) }()

	r := b.waitState(t, id, reminder.Quarantined)
	require.Equal(t, "delivered 4 times without an outcome", r.Reason)
	dead := b.drainDead(t, 1)
	require.EqualValues(t, 4, dead[0].Headers[message.HeaderReceiveCount])
	require.Equal(t, strconv.FormatInt(id, 10), dead[0].Headers[message.HeaderReminderID])
	require.Empty(t, b.sms.Attempts(), "nothing was sent")
}

// Inventory: the broker closes every connection mid-run. The worker goes
// not-ready, reconnects, re-declares, resumes, and nothing is lost or sent
// twice (deliveries of the dead channel are never acked on the new one;
// their redeliveries are absorbed by the fence).
func TestWorkerSurvivesTheBrokerClosingItsConnections(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
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
