package worker

import "math"

// The broker's prefetch counts messages, and a message is one reminder or
// an envelope of up to message.MaxBatchEntries. A worker holding a
// fixed number of messages would hold 50 times more reminders when the
// queue carries envelopes of 50: the first replica to start against a
// backlog would take all of it (400 envelopes, 20,000 reminders) and the
// replicas added later would find nothing to do. So the worker sizes its
// consumer's window in messages from what the recent deliveries carried,
// to hold about Config.Prefetch reminders: a window of Prefetch messages
// for single messages (retries, deferrals, the reconciler's republishes,
// an old dispatcher's), Prefetch / 50 for envelopes of 50, and never fewer
// than 4 × Concurrency messages (16 by default: 800 reminders in envelopes
// of 50, 3,200 in envelopes of 200, the most a worker holds at the
// defaults: at most 16 × message.MaxBatchBodyBytes, 768 KiB, of bodies;
// the provider calls in flight stay bounded by sendSlots and the rows read
// by Concurrency envelopes at once). A consumer's
// window is fixed when it is created (basic.qos before basic.consume,
// per consumer on a quorum queue), so a new window is a new consumer on
// the same channel: the deliveries the old one holds stay with the
// channel and are settled as before.

// prefetch decides the consumer's window. It is not safe for concurrent
// use: the session's consume loop owns it.
type prefetch struct {
	// limit is the reminders the worker should hold (Config.Prefetch).
	limit int
	// least is the smallest window, in messages: 4 × Config.Concurrency,
	// so that every batch slot has an envelope to take while others wait
	// for their entries' rate-limit slots (a paced send holds its envelope
	// unacked up to ratelimit.Horizon): with 2 × Concurrency, one worker
	// drained a rate-limited backlog of envelopes of 50 at about two
	// thirds of the speed, and a tenant deferred behind it was done 2 s later.
	least int
	// size estimates the reminders a delivery carries, from the recent
	// ones: it rises fast (half the way per delivery), so that a backlog of
	// envelopes is not taken at the singles' window, and falls slowly (a
	// sixteenth), so that a few single messages among envelopes do not
	// widen it.
	size float64
	// window is the consumer's window now, in messages.
	window int
}

// newPrefetch starts from the window for full batches of batch reminders:
// a worker starting against a backlog of envelopes takes only its share,
// and one that meets single messages widens its window after a few dozen.
func newPrefetch(limit, concurrency, batch int) *prefetch {
	p := &prefetch{limit: max(1, limit), size: float64(max(1, batch))}
	p.least = min(4*max(1, concurrency), p.limit)
	p.window = p.want()
	return p
}

// want is the window that holds about limit reminders at the estimated size.
func (p *prefetch) want() int {
	return min(p.limit, max(p.least, p.limit/int(max(1, math.Round(p.size)))))
}

// observe counts a delivery carrying reminders and returns the window the
// consumer should be given now, or 0 to keep its own: a new one only when
// it is twice or half the current one, so that a mix of envelopes and
// single messages does not make the worker consume anew at every delivery.
// While a mix shifts, the worker may hold up to twice limit reminders.
func (p *prefetch) observe(reminders int) int {
	r := float64(max(1, reminders))
	if r > p.size {
		p.size += (r - p.size) / 2
	} else {
		p.size += (r - p.size) / 16
	}
	w := p.want()
	if w >= 2*p.window || 2*w <= p.window {
		p.window = w
		return w
	}
	return 0
}
