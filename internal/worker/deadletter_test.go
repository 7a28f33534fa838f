package worker_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

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
