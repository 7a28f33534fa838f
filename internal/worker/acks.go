package worker

import (
	"slices"
	"sync"
	"sync/atomic"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ackWindow stands between a consume channel and its deliveries
// (amqp.Delivery.Acknowledger): it knows which delivery tags the channel
// handed over that are not settled yet, so that a batch whose acks cover
// the oldest of them, contiguously, is acknowledged with one frame
// (multiple=true) instead of one per message. A multiple ack settles every
// unsettled tag up to it on the channel, those of other batches in flight
// too, so ackPlan uses it only over tags this batch settles. Every Ack,
// Nack and Reject goes through the window, which forwards it and forgets
// the tag, all under one lock so that what it knows matches what the
// broker was told, in order.
type ackWindow struct {
	ch amqp.Acknowledger

	mu sync.Mutex
	// open are the tags received and not settled, ascending (a channel
	// numbers its deliveries in order).
	open []uint64
	// frames counts the acknowledgement frames sent, for tests and benchmarks.
	frames int
	// total, when set, counts them too, across the worker's sessions (Counts.AckFrames).
	total *atomic.Int64
}

func newAckWindow(ch amqp.Acknowledger) *ackWindow { return &ackWindow{ch: ch} }

// received records a delivery the channel handed over and makes it settle
// through the window.
func (a *ackWindow) received(d *amqp.Delivery) {
	a.mu.Lock()
	a.open = append(a.open, d.DeliveryTag)
	a.mu.Unlock()
	d.Acknowledger = a
}

// forget drops tags (ascending or not) from open; the caller holds mu.
func (a *ackWindow) forget(tags ...uint64) {
	for _, t := range tags {
		if i, ok := slices.BinarySearch(a.open, t); ok {
			a.open = slices.Delete(a.open, i, i+1)
		}
	}
}

// settled counts a frame settling tag (with multiple, every open tag up to
// it) and forgets what it settles; the caller holds mu.
func (a *ackWindow) settled(tag uint64, multiple bool) {
	a.frames++
	if a.total != nil {
		a.total.Add(1)
	}
	if multiple {
		i, _ := slices.BinarySearch(a.open, tag+1)
		a.open = slices.Delete(a.open, 0, i)
		return
	}
	a.forget(tag)
}

// Ack acknowledges one delivery (or, with multiple, every unsettled one up
// to tag).
func (a *ackWindow) Ack(tag uint64, multiple bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settled(tag, multiple)
	return a.ch.Ack(tag, multiple)
}

// Nack gives a delivery back (multiple is never used by the worker).
func (a *ackWindow) Nack(tag uint64, multiple, requeue bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settled(tag, multiple)
	return a.ch.Nack(tag, multiple, requeue)
}

// Reject rejects a delivery.
func (a *ackWindow) Reject(tag uint64, requeue bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settled(tag, false)
	return a.ch.Reject(tag, requeue)
}

// ackAll acknowledges tags, with as few frames as ackPlan allows.
func (a *ackWindow) ackAll(tags []uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	upTo, singles := ackPlan(a.open, tags)
	var first error
	if upTo != 0 {
		a.settled(upTo, true)
		first = a.ch.Ack(upTo, true)
	}
	for _, t := range singles {
		a.settled(t, false)
		if err := a.ch.Ack(t, false); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// ackPlan decides how to acknowledge the deliveries acks, given the tags of
// the channel still unsettled (open, ascending; acks among them). A
// multiple ack at upTo (0: none) settles every open tag up to it, so upTo is
// the end of the longest run at the head of open whose every tag is in
// acks, and only when that run holds two or more; singles are the other
// tags of acks, ascending, each acknowledged alone. A tag of open that acks
// does not hold (a delivery another batch still works on, or one given back
// or rejected after this plan) is never covered.
func ackPlan(open, acks []uint64) (upTo uint64, singles []uint64) {
	sorted := slices.Clone(acks)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	run := 0
	for run < len(open) && run < len(sorted) && open[run] == sorted[run] {
		run++
	}
	if run < 2 {
		return 0, sorted
	}
	return open[run-1], sorted[run:]
}
