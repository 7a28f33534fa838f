package worker

import (
	"context"
	"time"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
	"golang.org/x/time/rate"
)

// deliver reads, expires, admits and claims a batch, then sends and records
// it, except for claimed attempts that wait for a rate-limit slot: those it
// returns, to be sent by sendPaced without holding the batch. Without a rate
// limit on the channel nothing needs deciding between the read and the claim,
// so both are one statement (store.ClaimForDelivery).
func (w *Worker) deliver(ctx context.Context, items []*item) (paced []*item) {
	if !w.rateLimited() {
		return w.claimAndDeliver(ctx, items)
	}
	ids := make([]int64, len(items))
	for i, it := range items {
		ids[i] = it.env.ReminderID
	}
	var rows map[int64]store.Delivery
	if err := w.retryDB(ctx, "reading reminders", func() (err error) {
		rows, err = w.store.LoadForDelivery(ctx, ids)
		return err
	}); err != nil {
		return // not acked: redelivered when the channel closes
	}

	now := w.clock.Now()
	var toExpire, toClaim []*item
	for _, it := range items {
		row, ok := rows[it.env.ReminderID]
		it.row = row
		switch v := onRow(row, ok, it.env.Fence, w.cfg.Channel, now); v.kind {
		case kindExpire:
			toExpire = append(toExpire, it)
		case kindClaim:
			toClaim = append(toClaim, it)
		default:
			w.apply(ctx, it, v, now)
		}
	}
	w.expire(ctx, now, w.foundBeforeExpiry(ctx, now, toExpire))
	toClaim = w.admit(ctx, toClaim)
	if len(toClaim) == 0 {
		return
	}
	if err := w.waitLocal(ctx, len(toClaim)); err != nil {
		return
	}
	now = w.clock.Now()
	var claimed map[int64]store.Attempt
	if err := w.retryDB(ctx, "claiming attempts", func() (err error) {
		_, claimed, err = w.store.ClaimForDelivery(ctx, now, w.cfg.Channel, fenced(toClaim), w.cfg.SendLease, w.cfg.Name)
		return err
	}); err != nil {
		return
	}
	var sending []*item
	for _, it := range toClaim {
		if w.take(it, claimed, now) {
			sending = append(sending, it)
		}
	}
	return w.sendClaimed(ctx, sending, now)
}

// claimAndDeliver is deliver in one statement: it claims every message whose
// row is still at its fence, due and before its deadline, then judges the
// others from the rows as they were before the claim.
func (w *Worker) claimAndDeliver(ctx context.Context, items []*item) (paced []*item) {
	fs := make([]store.Fenced, len(items))
	for i, it := range items {
		fs[i] = store.Fenced{ID: it.env.ReminderID, Fence: it.env.Fence}
	}
	now := w.clock.Now()
	var rows map[int64]store.Delivery
	var claimed map[int64]store.Attempt
	if err := w.retryDB(ctx, "claiming attempts", func() (err error) {
		rows, claimed, err = w.store.ClaimForDelivery(ctx, now, w.cfg.Channel, fs, w.cfg.SendLease, w.cfg.Name)
		return err
	}); err != nil {
		return // not acked: redelivered when the channel closes
	}
	var sending, toExpire []*item
	for _, it := range items {
		row, ok := rows[it.env.ReminderID]
		it.row = row
		if _, won := claimed[it.env.ReminderID]; won {
			if w.take(it, claimed, now) {
				sending = append(sending, it)
			}
			continue
		}
		switch v := onRow(row, ok, it.env.Fence, w.cfg.Channel, now); v.kind {
		case kindExpire:
			toExpire = append(toExpire, it)
		case kindClaim:
			// The row looked claimable but moved on under the claim
			// (canceled, expired, or another delivery of the message won).
			w.apply(ctx, it, lostClaim(), now)
		default:
			w.apply(ctx, it, v, now)
		}
	}
	w.expire(ctx, now, w.foundBeforeExpiry(ctx, now, toExpire))
	return w.sendClaimed(ctx, sending, now)
}

// rateLimited reports whether sends on this channel wait for a limiter: then
// the admission comes between reading the rows and claiming them.
func (w *Worker) rateLimited() bool {
	if w.limiter != nil {
		return true
	}
	if w.fleet == nil {
		return false
	}
	l, ok := w.fleet.(interface{ Config() ratelimit.Config })
	if !ok {
		return true
	}
	_, limited := l.Config().Channels[string(w.cfg.Channel)]
	return limited
}

// apply carries out a verdict that settles one message on its own: a dead
// letter, a discard or a deferral until it is due.
func (w *Worker) apply(ctx context.Context, it *item, v verdict, now time.Time) {
	switch v.kind {
	case kindDeadLetter:
		w.deadLetter(ctx, it, v)
	case kindDiscard:
		w.discard(it, v.code)
	case kindDefer:
		// Early (clock skew, an early replay): back through the retry tier covering the wait.
		w.deferMany(ctx, []*item{it}, v.at.Sub(now))
	default:
		panic("worker: apply cannot carry out a " + v.kind.String())
	}
}

// discard acks a message that must not be processed, counting why (dup is
// a metrics.Dup* kind).
func (w *Worker) discard(it *item, dup string) {
	if dup == metrics.DupSuperseded {
		w.counts.superseded.Add(1)
	} else {
		w.counts.duplicates.Add(1)
	}
	w.m.Duplicate(string(w.cfg.Channel), dup)
	it.settled = toAck
}

// expire expires the rows of messages whose deadline is reached, at their fences.
func (w *Worker) expire(ctx context.Context, now time.Time, its []*item) {
	if len(its) == 0 {
		return
	}
	if err := w.retryDB(ctx, "expiring reminders", func() error {
		moved, err := w.store.ExpireFenced(ctx, now, fenced(its), w.cfg.Name, reasonDeadline)
		w.counts.expired.Add(int64(len(moved)))
		w.m.Outcomes(string(w.cfg.Channel), string(reminder.Expired), codeDeadline, len(moved))
		return err
	}); err == nil {
		for _, it := range its {
			it.settled = toAck // expired now, or moved on by someone else
		}
	}
}

// waitLocal waits, on the worker's clock, until this process's own rate
// limit (Config.Rate) allows n more sends. Nil limiter: no wait.
func (w *Worker) waitLocal(ctx context.Context, n int) error {
	if w.limiter == nil {
		return nil
	}
	now := w.clock.Now()
	rs := make([]*rate.Reservation, n)
	var wait time.Duration
	for i := range rs {
		rs[i] = w.limiter.ReserveN(now, 1)
		wait = max(wait, rs[i].DelayFrom(now))
	}
	if err := clock.Sleep(ctx, w.clock, wait); err != nil {
		for _, r := range rs {
			r.CancelAt(w.clock.Now())
		}
		return err
	}
	return nil
}

// take gives it the attempt claimed for its reminder, once: a second copy of
// the message in the same batch finds it taken and is a duplicate.
func (w *Worker) take(it *item, claimed map[int64]store.Attempt, now time.Time) bool {
	att, ok := claimed[it.row.ID]
	if !ok {
		w.discard(it, lostClaim().code)
		return false
	}
	delete(claimed, it.row.ID)
	it.att, it.claimedAt = att, now
	if it.env.Attempt == 0 {
		w.m.HopBetween(metrics.HopEnqueueToStart, string(w.cfg.Channel), it.env.FirstSeen, now)
	}
	return true
}
