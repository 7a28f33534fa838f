package worker

import (
	"context"
	"encoding/json"
	"slices"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/store"
)

// settlement is how a delivery ends when its batch is settled.
type settlement int

const (
	// unsettled: a step failed (database or broker down past its retries)
	// or was never reached; the message is given back (nack, requeue) and
	// its redelivery is judged against the row like any other.
	unsettled settlement = iota
	// toAck: its durable transition (or a confirmed copy) is done; ack it.
	toAck
	// rejected: already rejected to the queue's dead-letter exchange.
	rejected
)

// item is one delivery on its way through a batch.
type item struct {
	d   amqp.Delivery
	env message.Envelope
	row store.Delivery
	att store.Attempt

	// settled is how the delivery ends; once toAck or rejected no further step applies.
	settled settlement
	// out is the attempt's outcome, once sent.
	out store.Outcome
	// code is the outcome's short reason ("delivered", "http_503", "deadline").
	code string
	// claimedAt is when the attempt was claimed (the worker-start hop).
	claimedAt time.Time
	// sendAt is the send slot the rate limiter reserved (zero: at once).
	sendAt time.Time
	// earlier are the reminder's earlier attempts of unknown outcome, which
	// the provider is asked about before this one sends (lookup.go).
	earlier []provider.Earlier
	// refused is the verdict of the send's gate when it refused the
	// request; opened the worker clock's UnixNano when it let it go (send.go).
	// They live here, not in send's frame, so that the gate, which the
	// adapter calls, costs one allocation per send rather than three.
	refused atomic.Pointer[verdict]
	opened  atomic.Int64
	// sctx is the context of the attempt's provider call (sendctx.go).
	sctx sendCtx
	// provider is the provider the attempt is recorded as going to
	// (delivery_attempts.provider), "" when none.
	provider string
}

// process takes a batch from message to acknowledgement. Fresh deliveries
// go through together; redelivered ones (a consumer died or gave them back)
// one at a time, so a message that crashes its consumer cannot take a whole
// batch down with it again.
func (w *Worker) process(ctx context.Context, batch []amqp.Delivery) {
	if !slices.ContainsFunc(batch, redelivered) {
		w.processIsolated(ctx, batch) // the usual case: no copy
		return
	}
	fresh := make([]amqp.Delivery, 0, len(batch))
	for _, d := range batch {
		if deliveryCount(d) == 0 {
			fresh = append(fresh, d)
			continue
		}
		w.processIsolated(ctx, []amqp.Delivery{d})
	}
	if len(fresh) > 0 {
		w.processIsolated(ctx, fresh)
	}
}

// redelivered reports whether the broker delivered d before.
func redelivered(d amqp.Delivery) bool { return deliveryCount(d) != 0 }

// deliveryCount is how many times the broker delivered d before (0 on the
// first delivery). Only the broker's word counts: a quorum queue sets
// x-delivery-count on a redelivery (replacing any value a publisher put
// there), but on a first delivery the header is whatever the publisher
// sent, and it is outside the MAC. So a delivery the broker does not flag as
// redelivered has been delivered 0 times, whatever its headers say.
func deliveryCount(d amqp.Delivery) int64 {
	if !d.Redelivered {
		return 0
	}
	switch v := d.Headers["x-delivery-count"].(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	case int:
		return int64(v)
	}
	return 0
}

// opened is what opening a delivery gave: its reminders envs[from:to] of
// the batch's envelopes, or the error.
type opened struct {
	from, to int
	batch    bool
	err      error
}

// open verifies and decodes the deliveries of a batch, the reminders of
// every one in one slice.
func (w *Worker) open(batch []amqp.Delivery) (envs []message.Envelope, ops []opened) {
	envs = make([]message.Envelope, 0, len(batch))
	ops = make([]opened, len(batch))
	for i, d := range batch {
		op := &ops[i]
		op.from = len(envs)
		envs, op.batch, op.err = w.keys.OpenAll(d.Body, d.Headers, envs)
		op.to = len(envs)
		if op.err == nil && op.batch && envs[op.from].Channel != string(w.cfg.Channel) {
			// Another channel's envelope: dead-lettered whole (this worker
			// may not hold the keys to seal its entries alone).
			envs, op.to = envs[:op.from], op.from
		}
	}
	return envs, ops
}

func (w *Worker) processIsolated(ctx context.Context, batch []amqp.Delivery) {
	envs, ops := w.open(batch)
	n := 0
	for _, op := range ops {
		n += max(1, op.to-op.from)
	}
	items := make([]*item, 0, n)
	all := make([]item, n) // one allocation for the batch's items
	var dead []*item
	var envelopes []*envelopeAck
	defer func() {
		if p := recover(); p != nil {
			// A bug met this batch. Give the messages back (a redelivery is
			// processed alone, and one that keeps failing is quarantined;
			// an envelope's is split).
			w.log.Error().Interface("panic", p).Int("batch", len(batch)).Msg("processing panicked; returning the batch")
			giveBack(append(items, dead...))
			for _, g := range envelopes {
				g.abort()
			}
		}
	}()
	next := 0
	for i, d := range batch {
		op := ops[i]
		if op.batch && op.to > op.from && d.Redelivered {
			w.split(ctx, d, envs[op.from:op.to])
			continue
		}
		var g *envelopeAck
		if op.batch && op.to > op.from {
			g = newEnvelopeAck(d, op.to-op.from)
			envelopes = append(envelopes, g)
		}
		for j := op.from; j < max(op.to, op.from+1); j++ {
			it := &all[next]
			next++
			it.d = d
			var env message.Envelope
			if op.err == nil && j < op.to {
				env = envs[j]
				it.env = env
			} else if op.err == nil {
				// Another channel's envelope: its reminders are not read.
				env.Channel = channelOfBatch(d.Body)
			}
			if g != nil {
				it.d.Acknowledger = g
			}
			w.receive(ctx, it, op.err, env, &items, &dead)
		}
	}
	if len(items) > 0 {
		if paced := w.deliver(ctx, items); len(paced) > 0 {
			// Sends that wait for their rate-limit slots finish on their own,
			// so this batch's consumer slot goes back to work at once; they
			// are settled when recorded.
			w.settle(ctx, append(without(items, paced), dead...))
			w.inflight.Go(func() { w.sendPaced(ctx, paced) })
			return
		}
	}
	w.settle(ctx, append(items, dead...))
}

// receive judges an item before its row is read: dead-lettered or
// quarantined now (to dead), or on to the batch's items.
func (w *Worker) receive(ctx context.Context, it *item, openErr error, env message.Envelope, items, dead *[]*item) {
	switch v := onReceive(openErr, env, w.cfg.Channel, deliveryCount(it.d), w.cfg.PoisonAfter); v.kind {
	case kindDeadLetter:
		w.deadLetter(ctx, it, v)
		*dead = append(*dead, it)
	case kindQuarantine:
		w.quarantine(ctx, it, v)
		*dead = append(*dead, it)
	default:
		*items = append(*items, it)
	}
}

// channelOfBatch is the channel a verified envelope names.
func channelOfBatch(body []byte) string {
	var b struct {
		Channel string `json:"channel"`
	}
	_ = json.Unmarshal(body, &b)
	return b.Channel
}

// sendPaced sends claimed attempts at their reserved slots, records the
// outcomes and settles the messages.
func (w *Worker) sendPaced(ctx context.Context, items []*item) {
	defer func() {
		if p := recover(); p != nil {
			w.log.Error().Interface("panic", p).Int("batch", len(items)).Msg("sending panicked; returning the messages")
			giveBack(items)
		}
	}()
	w.sendAndRecord(ctx, items)
	w.settle(ctx, items)
}

// giveBack returns the unsettled messages to the queue after a panic.
func giveBack(items []*item) {
	for _, it := range items {
		if it.settled == unsettled {
			_ = it.d.Nack(false, true)
		}
	}
}

// without returns the items not in drop, in order.
func without(items, drop []*item) []*item { return members(items, drop, false) }

// members returns, in the order of items, those in sel (in) or not in sel (!in).
func members(items, sel []*item, in bool) []*item {
	set := make(map[*item]bool, len(sel))
	for _, it := range sel {
		set[it] = true
	}
	var out []*item
	for _, it := range items {
		if set[it] == in {
			out = append(out, it)
		}
	}
	return out
}

// settle acks what is done and gives back what is not: the give-backs
// first, then the acks, through the consume channel's ackWindow when the
// deliveries have one (a run of the oldest unsettled tags in one frame).
func (w *Worker) settle(ctx context.Context, items []*item) {
	if ctx.Err() != nil {
		return // past the grace period: nothing is acked; the broker redelivers
	}
	var win *ackWindow
	tags := make([]uint64, 0, len(items))
	for _, it := range items {
		var err error
		switch it.settled {
		case toAck:
			if aw, ok := it.d.Acknowledger.(*ackWindow); ok && (win == nil || aw == win) {
				win, tags = aw, append(tags, it.d.DeliveryTag)
				continue
			}
			err = it.d.Ack(false)
		case unsettled:
			// A step failed (database or broker down past its retries): give
			// the message back rather than hold it unacked; its redelivery
			// is judged against the row like any other.
			err = it.d.Nack(false, true)
		}
		if err != nil {
			w.with(w.log.Warn().Err(err), it).Msg("settling delivery failed; the broker will redeliver")
		}
	}
	if win != nil {
		if err := win.ackAll(tags); err != nil {
			w.log.Warn().Err(err).Int("count", len(tags)).Msg("acknowledging deliveries failed; the broker will redeliver")
		}
	}
}
