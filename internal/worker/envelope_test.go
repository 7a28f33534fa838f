package worker

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// envelope is a batch envelope (message.Batch) of the reminders ids at fence
// 7, as the broker hands it over.
func (b *fakeBundle) envelope(t testing.TB, tag uint64, ids ...int64) amqp.Delivery {
	t.Helper()
	bt := message.Batch{Channel: "sms", FirstSeen: t0}
	for _, id := range ids {
		bt.Entries = append(bt.Entries, message.Entry{ReminderID: id, Fence: 7, Tenant: "acme", Deadline: at(time.Hour)})
	}
	body, headers, err := b.keys.SealBatch(bt)
	require.NoError(t, err)
	return amqp.Delivery{Acknowledger: b.acks, DeliveryTag: tag, Body: body, Headers: amqp.Table(headers), MessageId: "b-" + strconv.Itoa(int(tag))}
}

// Issue 18: every entry of an envelope ends as it would alone, with a
// message of its own for whatever needs one (a retry, a deferral, a dead
// letter), and the envelope is acked once, after all of them; an
// old-format message beside it in the same batch is processed as before.
func TestEnvelopeEntriesEndAsTheyWouldAlone(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	for id := int64(1); id <= 7; id++ {
		b.addRow(row(func(r *store.Delivery) { r.ID = id }))
	}
	b.store.rows[3].State = reminder.Canceled
	b.store.rows[4].Deadline = t0
	b.store.rows[5].DueAt = at(10 * time.Second)
	b.sender.errs[2] = http503
	b.sender.errs[6] = http400

	b.w.process(context.Background(), []amqp.Delivery{
		b.envelope(t, 1, 1, 2, 3, 4, 5, 6, 99), // delivered, retried, superseded, expired, deferred, failed, unknown
		b.delivery(t, 2, 7),                    // an old-format message beside it: delivered
	})

	require.Equal(t, map[uint64]string{1: "ack", 2: "ack"}, b.acks.settled, "the envelope acked once, after every entry")
	require.ElementsMatch(t, []int64{1, 2, 6, 7}, b.sender.calls, "only the claimed attempts reached the provider, once each")
	for id, want := range map[int64]reminder.State{1: reminder.Delivered, 2: reminder.Retrying, 3: reminder.Canceled,
		4: reminder.Expired, 5: reminder.Enqueued, 6: reminder.Failed, 7: reminder.Delivered} {
		require.Equal(t, want, b.store.state(id), "reminder %d", id)
	}
	// Each message the worker published is one reminder's, opened alone.
	got := map[string]int64{}
	for _, m := range b.pub.sent {
		env, err := b.keys.Open(m.Msg.Body, m.Msg.Headers)
		require.NoError(t, err, "a single-reminder message: %s", m.Msg.Body)
		got[m.RoutingKey] = env.ReminderID
		if m.Exchange == topo.DeadExchange() {
			h := m.Msg.Headers
			require.Equal(t, "unknown reminder", h[message.HeaderReason])
			require.Equal(t, "99", h[message.HeaderReminderID])
			require.EqualValues(t, 1, h[message.HeaderReceiveCount])
			require.Equal(t, t0.UTC().Format(time.RFC3339), h[message.HeaderFirstSeen])
			require.Equal(t, at(time.Hour).UTC().Format(time.RFC3339), h[message.HeaderDeadline])
			require.Equal(t, "99-7", m.Msg.MessageId)
		}
	}
	require.Equal(t, map[string]int64{topo.RetryQueue("sms", time.Second): 2, topo.RetryQueue("sms", 30*time.Second): 5, "sms": 99}, got,
		"the retry, the deferral and the dead letter, each alone")
	require.Equal(t, Counts{Delivered: 2, Retried: 1, Failed: 1, Expired: 1, Superseded: 1, Deferred: 1, DeadLettered: 1}, b.w.Counts())
}

// The envelope is acked only once every entry is settled: while one entry's
// send is still in flight, nothing is acknowledged.
func TestEnvelopeIsAckedOnlyAfterEveryEntrySettles(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	for id := int64(1); id <= 3; id++ {
		b.addRow(row(func(r *store.Delivery) { r.ID = id }))
	}
	release := make(chan struct{})
	sending := make(chan struct{})
	b.w.sender = blockingSender{Sender: b.sender, id: 3, sending: sending, release: release}
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.w.process(context.Background(), []amqp.Delivery{b.envelope(t, 1, 1, 2, 3)})
	}()
	<-sending
	time.Sleep(20 * time.Millisecond) // would let a premature ack through
	b.acks.mu.Lock()
	require.Empty(t, b.acks.settled, "not acked while an entry is in flight")
	b.acks.mu.Unlock()
	close(release)
	<-done
	require.Equal(t, map[uint64]string{1: "ack"}, b.acks.settled)
	require.Equal(t, reminder.Delivered, b.store.state(3))
}

// blockingSender holds the send of reminder id until release.
type blockingSender struct {
	provider.Sender
	id               int64
	sending, release chan struct{}
}

func (s blockingSender) Send(ctx context.Context, m provider.Message) (string, error) {
	if m.ReminderID == s.id {
		close(s.sending)
		<-s.release
	}
	return s.Sender.Send(ctx, m)
}

// An entry that cannot be settled (the database down past its retries)
// gives the whole envelope back, once, after every entry reported; the
// other entries are not rejected, and nothing is dead-lettered.
func TestEnvelopeGoesBackWhenAnEntryIsNotSettled(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	g := newEnvelopeAck(b.envelope(t, 1, 1, 2), 2)
	it1 := &item{d: amqp.Delivery{Acknowledger: g}, settled: toAck}
	it2 := &item{d: amqp.Delivery{Acknowledger: g}, settled: unsettled}
	b.w.settle(context.Background(), []*item{it1})
	require.Empty(t, b.acks.settled, "one of two entries in")
	b.w.settle(context.Background(), []*item{it2})
	require.Equal(t, map[uint64]string{1: "nack-requeue"}, b.acks.settled)

	// Through the batch path: both entries unsettled, one give-back.
	b2 := setupFakes(t)
	b2.addRow(row(func(r *store.Delivery) { r.ID = 1 }))
	b2.store.fail = errors.New("connection refused")
	done := make(chan struct{})
	go func() {
		defer close(done)
		b2.w.process(context.Background(), []amqp.Delivery{b2.envelope(t, 1, 1, 2)})
	}()
	for {
		select {
		case <-done:
			require.Equal(t, map[uint64]string{1: "nack-requeue"}, b2.acks.settled)
			require.Empty(t, b2.pub.sent, "nothing dead-lettered or republished")
			return
		case <-time.After(time.Millisecond):
			b2.clock.Advance(5 * time.Second)
		}
	}
}

// A redelivered envelope is not processed: each entry is republished alone
// at its fence (the shortest retry tier leads back to the work queue), and
// the envelope is acked after those publishes are confirmed, so the queue's
// delivery limit never counts against fifty reminders for one poison entry.
func TestRedeliveredEnvelopeIsSplitIntoSingleMessages(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	for id := int64(1); id <= 3; id++ {
		b.addRow(row(func(r *store.Delivery) { r.ID = id }))
	}
	d := b.envelope(t, 1, 1, 2, 3)
	d.Redelivered = true
	d.Headers["x-delivery-count"] = int64(1)
	b.w.process(context.Background(), []amqp.Delivery{d, b.delivery(t, 2, 3)})

	require.Equal(t, map[uint64]string{1: "ack", 2: "ack"}, b.acks.settled)
	require.Equal(t, []int64{3}, b.sender.calls, "only the fresh single message was sent")
	var ids []int64
	for _, m := range b.pub.sent {
		require.Equal(t, topo.RetryQueue("sms", topo.Tier(0)), m.RoutingKey)
		env, err := b.keys.Open(m.Msg.Body, m.Msg.Headers)
		require.NoError(t, err)
		require.Equal(t, int64(7), env.Fence, "at the envelope's fence")
		require.Equal(t, t0, env.FirstSeen.UTC())
		ids = append(ids, env.ReminderID)
	}
	require.Equal(t, []int64{1, 2, 3}, ids)
	require.Equal(t, int64(1), b.w.Counts().Split)

	// The copy of reminder 3, whose single message was delivered meanwhile,
	// is discarded: the fence moved on.
	copy3 := b.pub.sent[2]
	b.w.process(context.Background(), []amqp.Delivery{{Acknowledger: b.acks, DeliveryTag: 3, Body: copy3.Msg.Body,
		Headers: copy3.Msg.Headers}})
	require.Equal(t, []int64{3}, b.sender.calls, "not sent twice")
	require.Equal(t, "ack", b.acks.settled[3])
}

// A panic while an envelope's entries are processed gives the envelope
// back at once (its redelivery is split), even if some entries had settled.
func TestPanicGivesTheEnvelopeBack(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	for id := int64(1); id <= 2; id++ {
		b.addRow(row(func(r *store.Delivery) { r.ID = id }))
	}
	b.w.store = panicStore{b.store}
	b.w.process(context.Background(), []amqp.Delivery{b.envelope(t, 1, 1, 2)})
	require.Equal(t, map[uint64]string{1: "nack-requeue"}, b.acks.settled)
}

// panicStore panics where the outcomes are recorded.
type panicStore struct{ *fakeStore }

func (panicStore) RecordOutcomes(context.Context, time.Time, []store.Outcome, string) (map[int64]bool, error) {
	panic("boom")
}

// An envelope larger than the worker's batch (the dispatcher's burst size)
// is claimed and recorded as one batch, but its sends go out at most
// Concurrency × Batch at once: no more provider connections and send
// goroutines than a worker made before envelopes could exceed its batch.
func TestEnvelopeSendsAreBoundedByTheWorkersSendSlots(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	w, err := New(Config{Channel: reminder.SMS, Concurrency: 1, Batch: 2}, Deps{Topology: topo, Store: b.store,
		Sender: b.sender, Keys: b.keys, Clock: b.clock, Log: zerolog.Nop(), Rand: func() float64 { return 0 }})
	require.NoError(t, err)
	w.pub = b.pub
	gate := &gatedSender{Sender: b.sender, entered: make(chan int64, 5), release: make(chan struct{})}
	w.sender = gate
	for id := int64(1); id <= 5; id++ {
		b.addRow(row(func(r *store.Delivery) { r.ID = id }))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.process(context.Background(), []amqp.Delivery{b.envelope(t, 1, 1, 2, 3, 4, 5)})
	}()
	<-gate.entered
	<-gate.entered
	select {
	case id := <-gate.entered:
		t.Fatalf("a third send (reminder %d) started while two were in flight with 1 × 2 send slots", id)
	case <-time.After(50 * time.Millisecond):
	}
	close(gate.release)
	<-done
	require.EqualValues(t, 2, gate.most.Load(), "most sends in flight at once")
	require.Equal(t, map[uint64]string{1: "ack"}, b.acks.settled)
	for id := int64(1); id <= 5; id++ {
		require.Equal(t, reminder.Delivered, b.store.state(id), "reminder %d", id)
	}
}

// gatedSender holds every send until release, and counts how many are in
// flight at once.
type gatedSender struct {
	provider.Sender
	entered   chan int64
	release   chan struct{}
	now, most atomic.Int64
}

func (s *gatedSender) Send(ctx context.Context, m provider.Message) (string, error) {
	n := s.now.Add(1)
	defer s.now.Add(-1)
	for {
		most := s.most.Load()
		if n <= most || s.most.CompareAndSwap(most, n) {
			break
		}
	}
	s.entered <- m.ReminderID
	<-s.release
	return s.Sender.Send(ctx, m)
}
