package worker_test

import (
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/provider"
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
	return setupWith(t, cfg, func(url string) provider.Sender {
		client, err := sms.New(sms.Config{URL: url, Timeout: 5 * time.Second})
		require.NoError(t, err)
		return client
	}, wrap...)
}

// setupWith is setup with the sender newSender builds for the fake's URL.
func setupWith(t *testing.T, cfg worker.Config, newSender func(url string) provider.Sender, wrap ...func(provider.Sender) provider.Sender) *bundle {
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
	sender := newSender(hs.URL)
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
	requireFoundAtProvider(t, b, id)
}

// Twilio does not deduplicate: only the lookup keeps the second attempt
// from sending a second text.
func TestTwilioTimeoutAfterAcceptIsDeliveredOnce(t *testing.T) {
	t.Parallel()
	b := setupWith(t, worker.Config{SendTimeout: 300 * time.Millisecond}, func(url string) provider.Sender {
		c, err := sms.NewTwilio(sms.TwilioConfig{URL: url, AccountSID: "AC1", AuthToken: "t", From: "+15005550006"})
		require.NoError(t, err)
		return c
	})
	require.NoError(t, b.sms.SetConfig(fakesms.Config{Stall: 2 * time.Second, Script: []fakesms.Outcome{fakesms.TimeoutAfterAccept}}))
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	requireFoundAtProvider(t, b, id)
	require.Equal(t, fakesms.APITwilio, b.sms.Messages()[0].API)
}

// requireFoundAtProvider waits for reminder id, whose first attempt timed
// out after the fake accepted it, and checks that the second attempt asked
// the provider, found the message and sent nothing.
func requireFoundAtProvider(t *testing.T, b *bundle, id int64) {
	t.Helper()
	r := b.waitState(t, id, reminder.Delivered)
	require.Equal(t, 2, r.Attempts, "the timed-out attempt is followed by one that asks the provider first")
	require.Contains(t, r.Reason, "found at the provider")
	require.Len(t, b.sms.Messages(), 1, "one message reached the phone")
	require.Len(t, b.sms.Attempts(), 1, "the lookup found it: nothing was sent again")
	require.Equal(t, 1, b.sms.Stats().Lookups)
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
	// The next attempt would come at least half an hour later (backoff from
	// 2h, capped at 1h, halved by the jitter at worst): past a deadline a
	// minute away, however slow the machine is to send the first attempt.
	b := setup(t, worker.Config{BackoffBase: 2 * time.Hour})
	require.NoError(t, b.sms.Enqueue("503"))
	id := b.schedule(t, "k", time.Minute)
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

// Issue 13, finding 8: after a 429 with Retry-After 600 s, a replayed copy
// of the retry message was sent 7 s later, and a Retry-After longer than the
// longest retry tier was cut to that tier. Now the next attempt time keeps
// the whole Retry-After, and neither the replayed copy nor the retry message
// back from its tier (2 s here, the longest) is sent before it: each goes
// back to wait. Once the clock passes it, the reminder is sent, once.
func TestRetryWaitsForItsNextAttemptTimeEvenWhenReplayed(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	require.NoError(t, b.sms.SetConfig(fakesms.Config{RetryAfterSeconds: 600, Script: []fakesms.Outcome{"429"}}))
	id := b.schedule(t, "k", 2*time.Hour)
	b.dispatch(t)
	r := b.waitState(t, id, reminder.Retrying)
	require.NotNil(t, r.NextAttemptAt)
	require.WithinDuration(t, b.clock.Now().Add(10*time.Minute), *r.NextAttemptAt, 10*time.Second,
		"the Retry-After is kept whole")

	body, headers, err := b.keys.Seal(message.Envelope{ReminderID: id, Fence: r.Fence, IdempotencyKey: r.IdempotencyKey,
		Channel: "sms", Tenant: "acme", Deadline: r.Deadline, Attempt: 1, FirstSeen: b.clock.Now()})
	require.NoError(t, err)
	b.publishRaw(t, "replayed", body, headers)
	// The replayed copy and the retry message (back after 2 s) each went
	// back to wait, unsent.
	require.Eventually(t, func() bool { return b.worker.Counts().Deferred >= 2 }, 20*time.Second, 20*time.Millisecond)
	require.Len(t, b.sms.Attempts(), 1, "nothing is sent before the next attempt time")
	require.Equal(t, reminder.Retrying, b.waitState(t, id, reminder.Retrying).State)

	b.clock.Advance(10 * time.Minute)
	b.waitState(t, id, reminder.Delivered)
	require.Len(t, b.sms.Attempts(), 2, "one more attempt, however many copies were waiting")
}
