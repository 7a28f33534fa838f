package worker_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Regression (security review): a validly signed message republished with
// x-delivery-count: 50 was quarantined and never sent. The header is outside
// the MAC and, on a first delivery, whatever the publisher put there: only a
// delivery the broker flags as redelivered has a count.
func TestForgedDeliveryCountDoesNotQuarantine(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{PoisonAfter: 3})
	b.stop(t)
	id := b.schedule(t, "k", time.Hour)
	b.dispatch(t)
	d := b.getQueued(t)
	forged := amqp.Table{"x-delivery-count": int64(50)}
	for k, v := range d.Headers {
		forged[k] = v
	}
	forged["x-delivery-count"] = int64(50)
	require.NoError(t, d.Ack(false))
	b.publishRaw(t, d.MessageId, d.Body, forged)

	w2, err := worker.New(worker.Config{Channel: reminder.SMS, PoisonAfter: 3}, worker.Deps{AMQPURL: b.mq.URL,
		Topology: b.mq.Topology, Store: b.st, Sender: mustSMS(t, b), Keys: b.keys, Clock: b.clock, Log: b.log})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w2.Run(ctx) }()
	b.waitState(t, id, reminder.Delivered)
	require.Len(t, b.sms.Attempts(), 1)
	require.Zero(t, w2.Counts().Quarantined)
}

// Regression (security review): a dead letter copied every incoming header,
// so an unsigned message carrying x-nudge-reminder-id was shown by the
// dead-letter tools as that reminder. Only the signature's headers are
// kept; the reminder's id comes only from a verified body.
func TestDeadLetterCarriesNoUnverifiedHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	id := b.schedule(t, "k", time.Hour)
	body := []byte(`{"id":1,"fence":0,"channel":"sms"}`)
	b.publishRaw(t, "unsigned-with-id", body, amqp.Table{
		message.HeaderReminderID: "1", message.HeaderDeadline: "2999-01-01T00:00:00Z",
		message.HeaderReceiveCount: int64(99), "x-evil": "injected", message.HeaderKeyID: int64(7),
	})
	dead := b.drainDead(t, 1)
	h := dead[0].Headers
	require.Equal(t, "unverifiable: message is not signed", h[message.HeaderReason])
	require.NotContains(t, h, message.HeaderReminderID)
	require.NotContains(t, h, message.HeaderDeadline)
	require.NotContains(t, h, "x-evil")
	require.NotContains(t, h, message.HeaderKeyID, "a non-string key id is not a signature header")
	require.EqualValues(t, 1, h[message.HeaderReceiveCount], "the broker's count, not the publisher's")

	r, err := intake.Get(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, reminder.Pending, r.State)
}
