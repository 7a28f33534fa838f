package worker_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// holdOne holds the send of the first reminder it sees whose id is in hold
// until release is closed, and says so on held.
type holdOne struct {
	provider.Sender
	hold    map[int64]bool
	once    sync.Once
	held    chan int64
	release chan struct{}
}

func (h *holdOne) Send(ctx context.Context, m provider.Message) (string, error) {
	if h.hold[m.ReminderID] {
		first := false
		h.once.Do(func() { first = true })
		if first {
			h.held <- m.ReminderID
			<-h.release
		}
	}
	return h.Sender.Send(ctx, m)
}

// Issue 18, on the real services: envelopes of many reminders and a
// single-reminder message (what a dispatcher before envelopes, or the
// reconciler, publishes) side by side in one queue: every reminder is
// delivered once.
func TestEnvelopesAndSingleMessagesSideBySide(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	var ids []int64
	for i := range 3 {
		ids = append(ids, b.schedule(t, "single-"+strconv.Itoa(i), time.Hour))
	}
	b.disp.Config.EnvelopeSize = 1 // the dispatcher's default is 50
	b.dispatch(t)                  // three single messages
	for i := range 120 {
		ids = append(ids, b.schedule(t, "env-"+strconv.Itoa(i), time.Hour))
	}
	b.disp.Config.EnvelopeSize = 50
	b.dispatch(t) // envelopes of 50, 50 and 20
	for _, id := range ids {
		b.waitState(t, id, reminder.Delivered)
	}
	require.Len(t, b.sms.Attempts(), len(ids), "each sent once")
	c := b.worker.Counts()
	require.Equal(t, int64(len(ids)), c.Delivered)
	require.Zero(t, c.DeadLettered+c.Split+c.Duplicates)
}

// Issue 18, inventory "a worker is killed mid-envelope": the connection
// closes while one entry of an envelope is still at the provider and the
// others have been sent. The envelope comes back redelivered and is split
// into single messages; each copy finds its reminder moved on from the
// envelope's fence (claimed) and is discarded, the held send completes and
// the batch is recorded, and nothing reaches the provider twice.
func TestEnvelopeKilledMidwayIsSplitAndNothingSentTwice(t *testing.T) {
	t.Parallel()
	hold := &holdOne{hold: map[int64]bool{}, held: make(chan int64, 1), release: make(chan struct{})}
	b := setup(t, worker.Config{}, func(s provider.Sender) provider.Sender { hold.Sender = s; return hold })
	defer func() {
		select {
		case <-hold.release:
		default:
			close(hold.release) // a failed test still lets the worker stop
		}
	}()
	var ids []int64
	for i := range 10 {
		id := b.schedule(t, "k"+strconv.Itoa(i), time.Hour)
		ids = append(ids, id)
		hold.hold[id] = i == 4
	}
	b.disp.Config.EnvelopeSize = 10
	b.dispatch(t)
	<-hold.held
	require.Eventually(t, func() bool { return len(b.sms.Attempts()) == 9 }, 20*time.Second, 10*time.Millisecond,
		"the other nine sent")
	require.Positive(t, testenv.CloseConnections(t, "w-"+b.mq.Topology.Prefix))
	// The lost session waits (up to Grace) for its batch before it
	// reconnects: the held send completes now and the batch is recorded,
	// but the envelope's ack dies with its channel.
	close(hold.release)
	for _, id := range ids {
		b.waitState(t, id, reminder.Delivered)
	}
	require.Eventually(t, func() bool { return b.worker.Counts().Split == 1 }, 20*time.Second, 10*time.Millisecond,
		"the redelivered envelope is split")
	require.Eventually(t, func() bool {
		c := b.worker.Counts()
		return c.Stale+c.Duplicates+c.Superseded == 10
	}, 20*time.Second, 10*time.Millisecond, "every copy discarded: its reminder is delivered")
	require.Len(t, b.sms.Attempts(), 10, "nothing sent twice")
	require.Len(t, b.sms.Messages(), 10)
}

// byID answers per reminder: the errors of errs[id] in turn, then the
// wrapped sender's answer.
type byID struct {
	provider.Sender
	mu   sync.Mutex
	errs map[int64][]error
}

func (s *byID) Send(ctx context.Context, m provider.Message) (string, error) {
	s.mu.Lock()
	var err error
	if q := s.errs[m.ReminderID]; len(q) > 0 {
		err, s.errs[m.ReminderID] = q[0], q[1:]
	}
	s.mu.Unlock()
	if err != nil {
		return "", err
	}
	return s.Sender.Send(ctx, m)
}

// Issue 18, on the real services: in one envelope, a reminder the provider
// answers 503 once, one it refuses for good, one canceled while the
// envelope waits and one whose deadline passes meanwhile each end as they
// would alone (retried through a single message, then delivered; failed;
// canceled; expired), beside one plainly delivered.
func TestEnvelopeEntriesEndAsTheyWouldAloneLive(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	b.stop(t)
	ids := map[string]int64{}
	for _, k := range []string{"ok", "retry", "fail", "cancel"} {
		ids[k] = b.schedule(t, k, time.Hour)
	}
	ids["late"] = b.schedule(t, "late", 2*time.Second)
	b.disp.Config.EnvelopeSize = 10
	b.dispatch(t) // one envelope of five
	ctx := context.Background()
	st, err := intake.Cancel(ctx, b.db.Pool, "acme", "cancel", "app", "learner unsubscribed")
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, st)
	b.clock.Advance(3 * time.Second) // past "late"'s deadline

	sender := &byID{Sender: mustSMS(t, b), errs: map[int64][]error{
		ids["retry"]: {provider.RetryableError("http_503", 0, errors.New("unavailable"))},
		ids["fail"]:  {provider.PermanentError("http_400", errors.New("bad number"))},
	}}
	w2 := b.startWorker(t, sender)

	b.waitState(t, ids["ok"], reminder.Delivered)
	r := b.waitState(t, ids["retry"], reminder.Delivered)
	require.Equal(t, 2, r.Attempts, "retried once, through a message of its own")
	b.waitState(t, ids["fail"], reminder.Failed)
	b.waitState(t, ids["late"], reminder.Expired)
	b.waitState(t, ids["cancel"], reminder.Canceled)
	require.Len(t, b.sms.Messages(), 2, "ok and retry, once each")
	c := w2.Counts()
	require.Positive(t, c.AckFrames)
	c.AckFrames = 0
	require.Equal(t, worker.Counts{Delivered: 2, Retried: 1, Failed: 1, Expired: 1, Superseded: 1}, c)
}

// startWorker starts a second SMS worker sending through sender, stopped
// when the test ends.
func (b *bundle) startWorker(t *testing.T, sender provider.Sender) *worker.Worker {
	t.Helper()
	return b.startWorkerWith(t, sender, nil)
}

// startWorkerWith is startWorker recording its metrics in m (nil: none).
func (b *bundle) startWorkerWith(t *testing.T, sender provider.Sender, m *metrics.Metrics) *worker.Worker {
	t.Helper()
	w, err := worker.New(worker.Config{Channel: reminder.SMS, BackoffBase: 100 * time.Millisecond}, worker.Deps{
		AMQPURL: b.mq.URL, Topology: b.mq.Topology, Store: b.st, Sender: sender, Keys: b.keys, Clock: b.clock, Log: b.log,
		Rand: func() float64 { return 0.5 }, Metrics: m})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return w
}

// Issue 18, the rolling upgrade: a worker older than envelopes verifies an
// envelope, refuses it as malformed (Open is all it has) and dead-letters
// it whole. Its reminders stay enqueued; once overdue the reconciler
// republishes each as a single message, which any worker delivers.
func TestAnEnvelopeAnOldWorkerDeadLettersIsRepublishedByTheReconciler(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	b.stop(t)
	var ids []int64
	for i := range 3 {
		ids = append(ids, b.schedule(t, "k"+strconv.Itoa(i), time.Hour))
	}
	b.disp.Config.EnvelopeSize = 10
	b.dispatch(t)

	d := b.getQueued(t)
	_, err := b.keys.Open(d.Body, d.Headers) // what the old worker calls
	require.ErrorIs(t, err, message.ErrMalformed)
	require.NoError(t, d.Ack(false)) // its dead letter published, the old worker acks
	for _, id := range ids {
		r, err := intake.Get(context.Background(), b.db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, reminder.Enqueued, r.State)
	}

	rec := &reconcile.Reconciler{Enqueuer: b.disp.Enqueuer, Config: reconcile.Config{Overdue: time.Minute}, Log: b.log}
	b.clock.Advance(2 * time.Minute)
	sum, err := rec.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, sum.Republished)
	w := b.startWorker(t, mustSMS(t, b))
	for _, id := range ids {
		b.waitState(t, id, reminder.Delivered)
	}
	require.Len(t, b.sms.Attempts(), 3)
	require.Equal(t, int64(3), w.Counts().Delivered)
}
