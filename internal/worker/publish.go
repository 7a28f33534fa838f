package worker

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// retryMessage seals a copy of the item's message under fence for the retry
// tier of delay, routed through the channel's retry exchange: the worker's
// broker user may write to no other exchange but the dead-letter one.
func (w *Worker) retryMessage(it *item, fence int64, delay time.Duration) broker.Outgoing {
	env := it.env
	if it.att.Number != 0 { // claimed: the copy carries its attempt number (else it keeps the message's)
		env.Attempt = it.att.Number
	}
	out, err := w.copyMessage(env, fence, delay)
	if err != nil {
		panic(err) // an Envelope this worker opened always encodes
	}
	return out
}

// copyMessage seals env under fence for the retry tier of delay.
func (w *Worker) copyMessage(env message.Envelope, fence int64, delay time.Duration) (broker.Outgoing, error) {
	env.Fence = fence
	body, headers, err := w.keys.Seal(env)
	if err != nil {
		return broker.Outgoing{}, err
	}
	return broker.Outgoing{
		Exchange:   w.topo.RetryExchange(string(w.cfg.Channel)),
		RoutingKey: w.topo.RetryQueue(string(w.cfg.Channel), delay),
		Msg: amqp.Publishing{
			MessageId:   fmt.Sprintf("%d-%d-r", env.ReminderID, fence),
			ContentType: "application/json",
			Timestamp:   w.clock.Now(),
			Headers:     headers,
			Body:        body,
		},
	}, nil
}

// publishRetries puts a copy of each retrying reminder's message in its retry
// tier; the original is acked only once the copy is confirmed. A copy that is
// not confirmed leaves the row retrying: the reconciler republishes it.
func (w *Worker) publishRetries(ctx context.Context, its []*item) {
	msgs := make([]broker.Outgoing, len(its))
	for i, it := range its {
		it.env.NotBefore = time.Time{} // a provider retry waits for its backoff, not a rate-limit turn
		delay := it.out.NextAttemptAt.Sub(w.clock.Now())
		msgs[i] = w.retryMessage(it, it.att.Fence, w.topo.Tier(delay))
	}
	results, err := w.pub.PublishBatch(ctx, msgs)
	for i, it := range its {
		if err == nil && results[i] == nil {
			w.counts.retried.Add(1)
			it.settled = toAck
		}
	}
	if err != nil {
		w.log.Warn().Err(err).Int("count", len(its)).Msg("retry publish failed; the reconciler will republish")
	}
}

// deferMany hands messages back through the retry tier covering wait, under
// their current fence, in one confirmed batch; each is settled once its copy
// is confirmed.
func (w *Worker) deferMany(ctx context.Context, its []*item, wait time.Duration) {
	tier := w.topo.Tier(wait)
	msgs := make([]broker.Outgoing, len(its))
	for i, it := range its {
		msgs[i] = w.retryMessage(it, it.env.Fence, tier)
		msgs[i].Msg.MessageId += "-d"
	}
	results, err := w.pub.PublishBatch(ctx, msgs)
	for i, it := range its {
		if err == nil && results[i] == nil {
			w.counts.deferred.Add(1)
			it.settled = toAck
		}
	}
}

// deadLetter moves a message the worker must not process to the channel's
// dead-letter queue with headers that explain v, then marks it settled. If
// that publish fails it rejects without requeue, so the queue's own
// dead-letter exchange takes it.
//
// An entry of an envelope is dead-lettered as a message of its own (sealed
// here, deadLetterBody), never the envelope. Of the incoming headers only
// the signature's two are kept (the dead-letter tools verify the body with
// them); every other header came from whoever
// published the message and is outside the MAC, so none is copied. The
// reminder's id, deadline and first-seen time are set only from a verified
// envelope, and the receive count only from what the broker vouches for.
//
// Once the message is in the dead-letter queue, a verified message's
// reminder (if it exists) gets a dead_lettered note in its timeline, so that
// nudgectl show says where its message went and why.
func (w *Worker) deadLetter(ctx context.Context, it *item, v verdict) {
	d := it.d
	body, headers, id, err := w.deadLetterBody(it)
	if err != nil {
		// An entry of an envelope this worker cannot seal alone: give the
		// envelope back; its redelivery is split into single messages.
		w.with(w.log.Error().Err(err).Str("reason", v.reason), it).Msg("dead letter not sealed; giving the envelope back")
		return
	}
	headers[message.HeaderReason] = v.reason
	headers[message.HeaderReceiveCount] = deliveryCount(d) + 1
	if it.env.ReminderID != 0 {
		headers[message.HeaderReminderID] = strconv.FormatInt(it.env.ReminderID, 10)
		headers[message.HeaderDeadline] = it.env.Deadline.UTC().Format(time.RFC3339)
		headers[message.HeaderFirstSeen] = it.env.FirstSeen.UTC().Format(time.RFC3339)
	} else {
		headers[message.HeaderFirstSeen] = w.clock.Now().UTC().Format(time.RFC3339)
	}
	out := broker.Outgoing{
		Exchange:   w.topo.DeadExchange(),
		RoutingKey: string(w.cfg.Channel),
		Msg: amqp.Publishing{
			MessageId: id, ContentType: d.ContentType, Timestamp: d.Timestamp,
			Headers: headers, Body: body,
		},
	}
	if out.Msg.MessageId == "" {
		out.Msg.MessageId = fmt.Sprintf("dead-%d", d.DeliveryTag)
	}
	w.with(w.log.Warn().Str("reason", v.reason), it).Msg("dead-lettering message")
	code := cmp.Or(v.code, "other")
	results, err := w.pub.PublishBatch(ctx, []broker.Outgoing{out})
	if err == nil && results[0] == nil {
		w.counts.dead.Add(1)
		w.m.DeadLettered(string(w.cfg.Channel), code)
		it.settled = toAck
		w.noteDeadLettered(ctx, it, v.reason)
		return
	}
	if envelopeOf(it) != nil {
		// Never reject an envelope for one entry: left unsettled, the
		// envelope goes back, and its redelivery is split; this reminder's
		// own message is dead-lettered then.
		return
	}
	if err := d.Reject(false); err == nil {
		it.settled = rejected
		w.counts.dead.Add(1)
		w.m.DeadLettered(string(w.cfg.Channel), code)
		w.noteDeadLettered(ctx, it, v.reason+" (rejected to the queue's dead-letter exchange: the dead-letter publish failed)")
	}
}

// singleID is the message id of reminder env's own message at its fence,
// as the dispatcher names it.
func singleID(env message.Envelope) string {
	return strconv.FormatInt(env.ReminderID, 10) + "-" + strconv.FormatInt(env.Fence, 10)
}

// noteDeadLettered records in the timeline of the reminder a verified
// message names that the message was dead-lettered, and why. One try: the
// dead letter carries its reason whatever happens here.
func (w *Worker) noteDeadLettered(ctx context.Context, it *item, reason string) {
	if it.env.ReminderID == 0 {
		return // unverified: the message's claims are not to be written down
	}
	if _, err := w.store.NoteEvents(ctx, w.clock.Now(), reminder.CodeDeadLettered,
		[]int64{it.env.ReminderID}, []string{reason}, w.cfg.Name); err != nil {
		w.with(w.log.Warn().Err(err), it).Msg("dead letter not noted in the reminder's timeline")
	}
}

// quarantine dead-letters a message that keeps failing, then parks its
// reminder (if the message is still current) so that nothing republishes it
// until an operator decides. Dead-letter first: a crash in between leaves a
// second copy in the dead-letter queue, never none.
func (w *Worker) quarantine(ctx context.Context, it *item, v verdict) {
	reason := v.reason
	w.deadLetter(ctx, it, v)
	if it.settled != toAck {
		return
	}
	f := []store.Fenced{{ID: it.env.ReminderID, Fence: it.env.Fence}}
	if err := w.retryDB(ctx, "quarantining", func() error {
		_, err := w.store.Quarantine(ctx, w.clock.Now(), f, w.cfg.Name, reason)
		return err
	}); err != nil {
		it.settled = unsettled // redelivered: dead-lettered again, quarantined then
	}
	w.counts.quarantined.Add(1)
}
