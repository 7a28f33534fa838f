package worker

import (
	"context"
	"slices"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
)

// A batch envelope (message.Batch, issue 18) is one delivery that carries
// many reminders. On its first delivery each entry becomes an item of the
// batch path like any single message (claimed at its fence, sent under the
// rate limit, its outcome recorded), and whatever an entry needs a message
// for is a message of its own: a retry, a deferral, a dead letter. The
// envelope is acknowledged once every entry is settled (envelopeAck). A
// redelivered envelope (a worker died or gave it back) is not processed:
// split republishes each entry alone and then acks it, so that one entry
// that kills its consumer cannot make the queue's delivery limit
// dead-letter all the others.

// envelopeAck is the Acknowledger of an envelope's entries: it counts their
// settlements and settles the envelope's delivery when the last one is in:
// an ack if every entry was acked, else a give-back (nack, requeue), whose
// redelivery is split. An entry settles it once, whether it is acked, given
// back or rejected.
type envelopeAck struct {
	// d is the envelope's delivery, settled through its own Acknowledger
	// (the consume channel's ackWindow).
	d amqp.Delivery

	mu   sync.Mutex
	left int  // entries not settled yet
	back bool // an entry was given back or rejected
	done bool // the envelope is settled
}

func newEnvelopeAck(d amqp.Delivery, entries int) *envelopeAck {
	return &envelopeAck{d: d, left: entries}
}

// Ack settles an entry done.
func (g *envelopeAck) Ack(uint64, bool) error { return g.report(false) }

// Nack settles an entry not done: the envelope goes back once all are in.
func (g *envelopeAck) Nack(uint64, bool, bool) error { return g.report(true) }

// Reject settles an entry not done: an envelope is never rejected whole for
// one entry (that would dead-letter the others); it goes back and is split.
func (g *envelopeAck) Reject(uint64, bool) error { return g.report(true) }

func (g *envelopeAck) report(back bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done {
		return nil
	}
	g.left--
	g.back = g.back || back
	if g.left > 0 {
		return nil
	}
	return g.finish()
}

// abort gives the envelope back now, whatever its entries reported (a
// panic: entries settled but not reported would otherwise hold it unacked
// until the channel closes).
func (g *envelopeAck) abort() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.done {
		g.back = true
		_ = g.finish()
	}
}

// finish settles the envelope; the caller holds mu.
func (g *envelopeAck) finish() error {
	g.done = true
	if g.back {
		return g.d.Nack(false, true)
	}
	return g.d.Ack(false)
}

// envelopeOf is the envelopeAck of an item from an envelope, nil for an item
// that is a message of its own.
func envelopeOf(it *item) *envelopeAck {
	g, _ := it.d.Acknowledger.(*envelopeAck)
	return g
}

// split republishes each reminder of a redelivered envelope as a message of
// its own at its fence, through the shortest retry tier (the only way back
// to the work queue open to a worker), and acks the envelope once every copy
// is confirmed; otherwise it gives the envelope back, to be split again.
// The copies are judged as any message is: a reminder that was sent or
// claimed before the envelope came back has moved on from its fence, so its
// copy is discarded, and nothing is sent twice.
func (w *Worker) split(ctx context.Context, d amqp.Delivery, envs []message.Envelope) {
	if ctx.Err() != nil {
		return // past the grace period: the broker redelivers it
	}
	tier := w.topo.Tier(0)
	msgs := make([]broker.Outgoing, len(envs))
	for i, env := range envs {
		var err error
		if msgs[i], err = w.copyMessage(env, env.Fence, tier); err != nil {
			// Not by construction (the dispatcher seals what fits alone):
			// to the queue's dead-letter exchange, whole.
			w.log.Error().Err(err).Int64("reminder_id", env.ReminderID).Msg("an envelope's entry does not seal alone; rejecting the envelope")
			_ = d.Reject(false)
			return
		}
		msgs[i].Msg.MessageId += "-s"
	}
	results, err := w.pub.PublishBatch(ctx, msgs)
	if err == nil && !slices.ContainsFunc(results, func(e error) bool { return e != nil }) {
		w.counts.split.Add(1)
		if err := d.Ack(false); err != nil {
			w.log.Warn().Err(err).Int("reminders", len(envs)).Msg("acknowledging a split envelope failed; the broker will redeliver it")
		}
		return
	}
	w.log.Warn().Err(err).Int("reminders", len(envs)).Msg("splitting a redelivered envelope failed; giving it back")
	if err := d.Nack(false, true); err != nil {
		w.log.Warn().Err(err).Msg("giving a redelivered envelope back failed; the broker will redeliver it")
	}
}

// deadLetterBody is the signed body and headers of the message a dead
// letter of it carries: the delivery's own, or, for an entry of an
// envelope, a single-reminder message sealed for it, so that the
// dead-letter queue and its tools see one reminder per message.
func (w *Worker) deadLetterBody(it *item) (body []byte, headers amqp.Table, id string, err error) {
	headers = amqp.Table{}
	if envelopeOf(it) == nil {
		for _, k := range []string{message.HeaderKeyID, message.HeaderSignature} {
			if s, ok := it.d.Headers[k].(string); ok {
				headers[k] = s
			}
		}
		return it.d.Body, headers, it.d.MessageId, nil
	}
	body, signed, err := w.keys.Seal(it.env)
	for k, v := range signed {
		headers[k] = v
	}
	return body, headers, singleID(it.env), err
}
