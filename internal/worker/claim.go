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
	var windows windowed
	for _, it := range items {
		row, ok := rows[it.env.ReminderID]
		it.row = row
		v := onRow(row, ok, it.env.Fence, w.cfg.Channel, now)
		if v.kind == kindClaim {
			v = windowBeforeClaim(row.Window, row.Zone, now, row.Deadline)
		}
		switch v.kind {
		case kindExpire:
			toExpire = append(toExpire, it)
		case kindClaim:
			toClaim = append(toClaim, it)
		case kindWaitWindow, kindExpireNoWindow, kindQuarantine:
			windows.add(it, v)
		default:
			w.apply(ctx, it, v, now)
		}
	}
	w.expire(ctx, now, w.foundBeforeExpiry(ctx, now, toExpire))
	w.settleWindows(ctx, now, windows)
	toClaim = w.admit(ctx, toClaim)
	if len(toClaim) == 0 {
		return
	}
	if err := w.waitLocal(ctx, len(toClaim)); err != nil {
		return
	}
	now = w.clock.Now()
	var claimed map[int64]store.Attempt
	prov := w.providerName()
	if err := w.retryDB(ctx, "claiming attempts", func() (err error) {
		_, claimed, err = w.store.ClaimForDelivery(ctx, now, w.cfg.Channel, prov, fenced(toClaim), w.cfg.SendLease, w.cfg.Name)
		return err
	}); err != nil {
		return
	}
	var sending []*item
	for _, it := range toClaim {
		if w.take(it, claimed, now) {
			it.provider = prov
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
	prov := w.providerName()
	if err := w.retryDB(ctx, "claiming attempts", func() (err error) {
		rows, claimed, err = w.store.ClaimForDelivery(ctx, now, w.cfg.Channel, prov, fs, w.cfg.SendLease, w.cfg.Name)
		return err
	}); err != nil {
		return // not acked: redelivered when the channel closes
	}
	var sending, toExpire []*item
	var windows windowed
	for _, it := range items {
		row, ok := rows[it.env.ReminderID]
		it.row = row
		if _, won := claimed[it.env.ReminderID]; won {
			if w.take(it, claimed, now) {
				it.provider = prov
				sending = append(sending, it)
			}
			continue
		}
		v := onRow(row, ok, it.env.Fence, w.cfg.Channel, now)
		if v.kind == kindClaim {
			// Not claimed: its send window is closed (the claim checks it),
			// or the row moved on under the claim (canceled, expired, or
			// another delivery of the message won).
			if v = windowBeforeClaim(row.Window, row.Zone, now, row.Deadline); v.kind == kindClaim {
				v = lostClaim()
			}
		}
		switch v.kind {
		case kindExpire:
			toExpire = append(toExpire, it)
		case kindWaitWindow, kindExpireNoWindow, kindQuarantine:
			windows.add(it, v)
		default:
			w.apply(ctx, it, v, now)
		}
	}
	w.expire(ctx, now, w.foundBeforeExpiry(ctx, now, toExpire))
	w.settleWindows(ctx, now, windows)
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

// windowed are the messages whose send window kept them from being claimed.
type windowed struct {
	waits, late, unknown []*item
	reasons              []string // of unknown
}

func (ws *windowed) add(it *item, v verdict) {
	switch v.kind {
	case kindWaitWindow:
		it.env.NotBefore = v.at // waited for as a rate-limit turn is
		ws.waits = append(ws.waits, it)
	case kindExpireNoWindow:
		ws.late = append(ws.late, it)
	default:
		ws.unknown, ws.reasons = append(ws.unknown, it), append(ws.reasons, v.reason)
	}
}

// settleWindows carries out the window verdicts: messages whose window
// opens before the deadline record the opening (so the reconciler does not
// take the wait for a lost message) and wait for it in the retry tiers;
// the others are expired now; one in a zone this worker cannot read is
// quarantined.
func (w *Worker) settleWindows(ctx context.Context, now time.Time, ws windowed) {
	ch := string(w.cfg.Channel)
	if len(ws.late) > 0 {
		if err := w.retryDB(ctx, "expiring reminders with no send window", func() error {
			moved, err := w.store.ExpireNoWindow(ctx, now, fenced(ws.late), w.cfg.Name, reasonNoWindow)
			w.counts.expired.Add(int64(len(moved)))
			w.m.Outcomes(ch, string(reminder.Expired), codeNoWindow, len(moved))
			return err
		}); err == nil {
			for _, it := range ws.late {
				it.settled = toAck
			}
		}
	}
	if len(ws.waits) > 0 {
		untils := make([]time.Time, len(ws.waits))
		for i, it := range ws.waits {
			untils[i] = it.env.NotBefore
		}
		if err := w.retryDB(ctx, "deferring reminders to their send window", func() error {
			_, err := w.store.Defer(ctx, now, fenced(ws.waits), untils)
			return err
		}); err == nil {
			w.waitForTurns(ctx, now, ws.waits)
		}
	}
	for i, it := range ws.unknown {
		w.quarantine(ctx, it, verdict{kind: kindQuarantine, code: codePoison, reason: ws.reasons[i]})
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
