package ops_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/ops/opstest"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

type dlqBundle struct {
	db   *testenv.DB
	mq   *testenv.Broker
	keys *message.Keyring
	dlq  ops.DLQ
}

func setupDLQ(t *testing.T) *dlqBundle {
	t.Helper()
	b := &dlqBundle{db: testenv.Postgres(t), mq: testenv.RabbitMQ(t), keys: opstest.Keys(t)}
	b.dlq = ops.DLQ{URL: b.mq.URL, Topology: b.mq.Topology, Wait: 5 * time.Second, Keys: b.keys}
	return b
}

// deadLetters publishes n dead letters naming reminders 1..n, in order.
func (b *dlqBundle) deadLetters(t *testing.T, n int) []string {
	t.Helper()
	msgs := make([]opstest.DeadLetter, n)
	for i := range msgs {
		msgs[i] = opstest.DeadLetter{ReminderID: int64(i + 1), Fence: 2, Tenant: "acme",
			Deadline: time.Now().Add(time.Hour), Reason: fmt.Sprintf("delivered %d times without an outcome", i+6),
			ReceiveCount: int64(i + 6)}
	}
	return opstest.Publish(t, b.mq.URL, b.mq.Topology, b.keys, msgs...)
}

// A read sees every message in order with the worker's explanation, and
// leaves the queue exactly as it was: same order, same receive counts; only
// the broker's own x-delivery-count (Reads) goes up by one per read.
func TestDLQReadKeepsOrderAndCounts(t *testing.T) {
	t.Parallel()
	b := setupDLQ(t)
	want := b.deadLetters(t, 6)

	for read := range 3 {
		r, err := b.dlq.Read(context.Background(), reminder.Email)
		require.NoError(t, err)
		require.Equal(t, 6, r.Depth)
		require.False(t, r.Incomplete)
		var got []string
		for i, m := range r.Messages {
			got = append(got, m.MessageID)
			require.Equal(t, i+1, m.Position)
			require.Equal(t, int64(i+1), m.ReminderID)
			require.True(t, m.Verified, "its signed body names it")
			require.Equal(t, int64(i+6), m.ReceiveCount, "the receive count is the worker's, unchanged by reads")
			require.Equal(t, fmt.Sprintf("delivered %d times without an outcome", i+6), m.Reason)
			require.Equal(t, int64(read), m.Reads, "x-delivery-count: one per earlier read")
			require.NotNil(t, m.FirstSeen)
			require.NotNil(t, m.Deadline)
			require.Equal(t, "acme", m.Tenant)
		}
		require.Equal(t, want, got, "read %d: order kept", read)
		require.NoError(t, r.Close())
	}
	require.Equal(t, want, opstest.QueueIDs(t, b.mq.URL, b.mq.Topology, reminder.Email))
	require.Empty(t, opstest.QueueIDs(t, b.mq.URL, b.mq.Topology, reminder.SMS), "channels are separate queues")
}

// Why a read must take the whole queue: on RabbitMQ 3.10 a quorum queue
// serves returned messages before never-delivered ones but in the order they
// were returned, so returning only a prefix (a partial read, the management
// UI's "get N" with requeue) moves that prefix behind the rest once every
// message has been returned at least once. This pins the broker behaviour
// DLQ.Read is designed around; if it changes, revisit the design.
func TestQuorumQueueReturnsMovePrefixBehind(t *testing.T) {
	t.Parallel()
	b := setupDLQ(t)
	want := b.deadLetters(t, 5)
	require.Equal(t, want, opstest.QueueIDs(t, b.mq.URL, b.mq.Topology, reminder.Email)) // all returned once

	conn, err := broker.Dial(b.mq.URL, "partial-read")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Qos(2, 0, false))
	ds, err := ch.Consume(b.mq.Topology.DeadQueue("email"), "", false, false, false, false, nil)
	require.NoError(t, err)
	for range 2 {
		<-ds
	}
	require.NoError(t, ch.Close()) // returns the first two

	rotated := append(append([]string{}, want[2:]...), want[:2]...)
	require.Equal(t, rotated, opstest.QueueIDs(t, b.mq.URL, b.mq.Topology, reminder.Email),
		"a partial read moved the head behind the rest")
}

// A queue deeper than the read may hold is refused rather than read in part
// (which would reorder it), and is left untouched.
func TestDLQReadRefusesTooDeepAQueue(t *testing.T) {
	t.Parallel()
	b := setupDLQ(t)
	want := b.deadLetters(t, 4)
	d := b.dlq
	d.MaxMessages = 3
	_, err := d.Read(context.Background(), reminder.Email)
	require.ErrorIs(t, err, ops.ErrDLQTooLarge)
	require.Equal(t, want, opstest.QueueIDs(t, b.mq.URL, b.mq.Topology, reminder.Email))
}

// Two operators cannot read the same queue at once: their returns would
// interleave.
func TestDLQReadIsExclusive(t *testing.T) {
	t.Parallel()
	b := setupDLQ(t)
	want := b.deadLetters(t, 2)
	first, err := b.dlq.Read(context.Background(), reminder.Email)
	require.NoError(t, err)
	_, err = b.dlq.Read(context.Background(), reminder.Email)
	require.ErrorIs(t, err, ops.ErrDLQBusy)
	require.NoError(t, first.Close())
	require.Equal(t, want, opstest.QueueIDs(t, b.mq.URL, b.mq.Topology, reminder.Email))
}

func TestDLQReadMissingQueue(t *testing.T) {
	t.Parallel()
	b := setupDLQ(t)
	d := b.dlq
	d.Topology = broker.Topology{Prefix: "t-missing-" + testenv.RandomID()}.WithDefaults()
	_, err := d.Read(context.Background(), reminder.Email)
	require.ErrorIs(t, err, ops.ErrDLQMissing)
}

// A message the broker dead-lettered itself (delivery limit) has no x-nudge
// headers: its reason comes from x-death, and its reminder is verified only
// through the body's signature when the keys are given.
func TestDLQBrokerDeadLetteredMessage(t *testing.T) {
	t.Parallel()
	b := setupDLQ(t)
	body, headers, err := b.keys.Seal(message.Envelope{ReminderID: 42, Fence: 3, Channel: "email", Tenant: "acme",
		Deadline: time.Now().Add(time.Hour), FirstSeen: time.Now()})
	require.NoError(t, err)
	h := amqp.Table{"x-first-death-reason": "delivery_limit", "x-first-death-queue": b.mq.Topology.Queue("email")}
	for k, v := range headers {
		h[k] = v
	}
	pub := broker.NewPublisher(b.mq.URL, b.mq.Topology, "test")
	defer pub.Close()
	res, err := pub.PublishBatch(context.Background(), []broker.Outgoing{{Exchange: b.mq.Topology.DeadExchange(),
		RoutingKey: "email", Msg: amqp.Publishing{MessageId: "42-3", Headers: h, Body: body}}})
	require.NoError(t, err)
	require.NoError(t, res[0])

	noKeys := b.dlq
	noKeys.Keys = nil
	r, err := noKeys.Read(context.Background(), reminder.Email)
	require.NoError(t, err)
	m := r.Messages[0]
	require.Equal(t, "broker: delivery_limit from "+b.mq.Topology.Queue("email"), m.Reason)
	require.Equal(t, int64(42), m.ReminderID)
	require.False(t, m.Verified, "without keys the body is only a hint")
	require.NoError(t, r.Close())

	r, err = b.dlq.Read(context.Background(), reminder.Email)
	require.NoError(t, err)
	require.True(t, r.Messages[0].Verified, "the body's signature verifies")
	require.NoError(t, r.Close())
}

// Regression (security review): an unsigned message carrying the
// x-nudge-reminder-id header was shown as "reminder 3 (verified)" and a
// replay dry run offered to replay it. Headers are outside the MAC: only a
// signed body names a reminder, and it wins over a header that disagrees.
func TestDLQVerifiesOnlyWhatTheMACCovers(t *testing.T) {
	t.Parallel()
	b := setupDLQ(t)
	signed, sig, err := b.keys.Seal(message.Envelope{ReminderID: 7, Fence: 1, Channel: "email",
		Deadline: time.Now().Add(time.Hour), FirstSeen: time.Now()})
	require.NoError(t, err)
	lying := amqp.Table{message.HeaderReminderID: "3", message.HeaderDeadline: "2999-01-01T00:00:00Z"}
	for k, v := range sig {
		lying[k] = v
	}
	pub := broker.NewPublisher(b.mq.URL, b.mq.Topology, "test")
	defer pub.Close()
	res, err := pub.PublishBatch(context.Background(), []broker.Outgoing{
		{Exchange: b.mq.Topology.DeadExchange(), RoutingKey: "email", Msg: amqp.Publishing{MessageId: "forged",
			Headers: amqp.Table{message.HeaderReminderID: "3"}, Body: []byte(`{"id":3,"channel":"email"}`)}},
		{Exchange: b.mq.Topology.DeadExchange(), RoutingKey: "email", Msg: amqp.Publishing{MessageId: "signed",
			Headers: lying, Body: signed}},
	})
	require.NoError(t, err)
	require.NoError(t, res[0])
	require.NoError(t, res[1])

	r, err := b.dlq.Read(context.Background(), reminder.Email)
	require.NoError(t, err)
	defer r.Close()
	require.Len(t, r.Messages, 2)
	forged, good := r.Messages[0], r.Messages[1]
	require.Equal(t, int64(3), forged.ReminderID, "shown")
	require.False(t, forged.Verified, "an unsigned body with the header is not verified")
	require.Equal(t, int64(7), good.ReminderID, "the signed body wins over the header")
	require.True(t, good.Verified)
	require.Less(t, good.Deadline.Year(), 2999, "the deadline comes from the signed body")
}
