package worker

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/faults"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// item is one delivery on its way through a batch.
type item struct {
	d   amqp.Delivery
	env message.Envelope
	row store.Delivery
	att store.Attempt

	// outcome, once sent
	out store.Outcome
	// done: settled (to be acked); no further step applies.
	done bool
	// rejected: already rejected to the queue's dead-letter exchange.
	rejected bool
	// code is the outcome's short reason ("delivered", "http_503", "deadline").
	code string
	// claimedAt is when the attempt was claimed (the worker-start hop).
	claimedAt time.Time
	// sendAt is the send slot the rate limiter reserved (zero: at once).
	sendAt time.Time
}

// process takes a batch from message to acknowledgement. Fresh deliveries
// go through together; redelivered ones (a consumer died or gave them back)
// one at a time, so a message that crashes its consumer cannot take a whole
// batch down with it again.
func (w *Worker) process(ctx context.Context, batch []amqp.Delivery) {
	var fresh []amqp.Delivery
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

// deliveryCount is how many times the broker delivered d before (0 on the first delivery).
func deliveryCount(d amqp.Delivery) int64 {
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

func (w *Worker) processIsolated(ctx context.Context, batch []amqp.Delivery) {
	items := make([]*item, 0, len(batch))
	var dead []*item
	defer func() {
		if p := recover(); p != nil {
			// A bug met this batch. Give the messages back (a redelivery is
			// processed alone, and one that keeps failing is quarantined).
			w.log.Error().Interface("panic", p).Int("batch", len(batch)).Msg("processing panicked; returning the batch")
			for _, it := range append(items, dead...) {
				if !it.done && !it.rejected {
					_ = it.d.Nack(false, true)
				}
			}
		}
	}()
	for _, d := range batch {
		it := &item{d: d}
		env, err := w.keys.Open(d.Body, d.Headers)
		switch {
		case err != nil:
			w.deadLetter(ctx, it, "unverifiable: "+err.Error())
			dead = append(dead, it)
		case env.Channel != string(w.cfg.Channel):
			it.env = env
			w.deadLetter(ctx, it, fmt.Sprintf("wrong channel %q on the %s queue", env.Channel, w.cfg.Channel))
			dead = append(dead, it)
		case deliveryCount(d) >= int64(w.cfg.PoisonAfter):
			it.env = env
			w.quarantine(ctx, it, fmt.Sprintf("delivered %d times without an outcome", deliveryCount(d)+1))
			dead = append(dead, it)
		default:
			it.env = env
			items = append(items, it)
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

// sendPaced sends claimed attempts at their reserved slots, records the
// outcomes and settles the messages.
func (w *Worker) sendPaced(ctx context.Context, items []*item) {
	defer func() {
		if p := recover(); p != nil {
			w.log.Error().Interface("panic", p).Int("batch", len(items)).Msg("sending panicked; returning the messages")
			for _, it := range items {
				if !it.done && !it.rejected {
					_ = it.d.Nack(false, true)
				}
			}
		}
	}()
	w.sendAndRecord(ctx, items)
	w.settle(ctx, items)
}

// without returns the items not in drop.
func without(items, drop []*item) []*item {
	skip := make(map[*item]bool, len(drop))
	for _, it := range drop {
		skip[it] = true
	}
	var out []*item
	for _, it := range items {
		if !skip[it] {
			out = append(out, it)
		}
	}
	return out
}

// settle acks what is done and gives back what is not.
func (w *Worker) settle(ctx context.Context, items []*item) {
	if ctx.Err() != nil {
		return // past the grace period: nothing is acked; the broker redelivers
	}
	for _, it := range items {
		var err error
		switch {
		case it.done:
			err = it.d.Ack(false)
		case !it.rejected:
			// A step failed (database or broker down past its retries): give
			// the message back rather than hold it unacked; its redelivery
			// is judged against the row like any other.
			err = it.d.Nack(false, true)
		}
		if err != nil {
			w.with(w.log.Warn().Err(err), it).Msg("settling delivery failed; the broker will redeliver")
		}
	}
}

// quarantine dead-letters a message that keeps failing, then parks its
// reminder (if the message is still current) so that nothing republishes it
// until an operator decides. Dead-letter first: a crash in between leaves a
// second copy in the dead-letter queue, never none.
func (w *Worker) quarantine(ctx context.Context, it *item, reason string) {
	w.deadLetter(ctx, it, reason)
	if !it.done {
		return
	}
	f := []store.Fenced{{ID: it.env.ReminderID, Fence: it.env.Fence}}
	if err := w.retryDB(ctx, "quarantining", func() error {
		_, err := w.store.Quarantine(ctx, w.clock.Now(), f, w.cfg.Name, reason)
		return err
	}); err != nil {
		it.done = false // redelivered: dead-lettered again, quarantined then
	}
	w.counts.quarantined.Add(1)
}

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
	var claim []store.Fenced
	var toExpire, toClaim []*item
	for _, it := range items {
		switch w.judge(ctx, it, rows, now) {
		case toBeExpired:
			toExpire = append(toExpire, it)
		case claimable:
			claim = append(claim, store.Fenced{ID: it.row.ID, Fence: it.row.Fence})
			toClaim = append(toClaim, it)
		}
	}
	w.expire(ctx, now, toExpire)
	claim, toClaim = w.admit(ctx, claim, toClaim)
	if len(claim) == 0 {
		return
	}
	if w.limiter != nil {
		for range claim {
			if err := w.limiter.Wait(ctx); err != nil {
				return
			}
		}
	}
	now = w.clock.Now()
	var claimed map[int64]store.Attempt
	if err := w.retryDB(ctx, "claiming attempts", func() (err error) {
		claimed, err = w.store.ClaimAttempts(ctx, now, claim, w.cfg.SendLease, w.cfg.Name)
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
		rows, claimed, err = w.store.ClaimForDelivery(ctx, now, fs, w.cfg.SendLease, w.cfg.Name)
		return err
	}); err != nil {
		return // not acked: redelivered when the channel closes
	}
	var sending, toExpire []*item
	for _, it := range items {
		if _, ok := claimed[it.env.ReminderID]; ok {
			it.row = rows[it.env.ReminderID]
			if w.take(it, claimed, now) {
				sending = append(sending, it)
			}
			continue
		}
		switch w.judge(ctx, it, rows, now) {
		case toBeExpired:
			toExpire = append(toExpire, it)
		case claimable:
			// The row looked claimable but moved on under the claim
			// (canceled, expired, or another delivery of the message won).
			w.lostClaim(it)
		}
	}
	w.expire(ctx, now, toExpire)
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

// verdict is what a message's row says about it before a claim.
type verdict int

const (
	// settled: nothing to claim (unknown, terminal, superseded, deferred).
	settled verdict = iota
	// toBeExpired: the deadline is reached; expire the row at the message's fence.
	toBeExpired
	// claimable: claim the attempt.
	claimable
)

// judge reads its row out of rows (it.row) and settles the message when the
// row says there is nothing to claim.
func (w *Worker) judge(ctx context.Context, it *item, rows map[int64]store.Delivery, now time.Time) verdict {
	row, ok := rows[it.env.ReminderID]
	it.row = row
	switch {
	case !ok:
		w.deadLetter(ctx, it, "unknown reminder")
	case row.State.Terminal() || row.Fence != it.env.Fence:
		// A decision newer than this message was taken: count whether
		// it was a cancel or expiry (superseded) or this message's own
		// earlier delivery (a duplicate consume, suppressed).
		if row.State == reminder.Canceled || row.State == reminder.Expired {
			w.counts.superseded.Add(1)
			w.m.Duplicate(string(w.cfg.Channel), metrics.DupSuperseded)
		} else {
			w.counts.duplicates.Add(1)
			w.m.Duplicate(string(w.cfg.Channel), metrics.DupConsume)
		}
		it.done = true
	case !now.Before(row.Deadline):
		return toBeExpired
	case row.DueAt.After(now):
		w.defer_(ctx, it, row.DueAt.Sub(now))
	default:
		return claimable
	}
	return settled
}

// expire expires the rows of messages whose deadline is reached, at their fences.
func (w *Worker) expire(ctx context.Context, now time.Time, its []*item) {
	if len(its) == 0 {
		return
	}
	if err := w.retryDB(ctx, "expiring reminders", func() error {
		moved, err := w.store.ExpireFenced(ctx, now, fenced(its), w.cfg.Name, "deadline reached before the send started")
		w.counts.expired.Add(int64(len(moved)))
		w.m.Outcomes(string(w.cfg.Channel), string(reminder.Expired), "deadline", len(moved))
		return err
	}); err == nil {
		for _, it := range its {
			it.done = true // expired now, or moved on by someone else
		}
	}
}

// take gives it the attempt claimed for its reminder, once: a second copy of
// the message in the same batch finds it taken and is a duplicate.
func (w *Worker) take(it *item, claimed map[int64]store.Attempt, now time.Time) bool {
	att, ok := claimed[it.row.ID]
	if !ok {
		w.lostClaim(it)
		return false
	}
	delete(claimed, it.row.ID)
	it.att, it.claimedAt = att, now
	if it.env.Attempt == 0 {
		w.m.HopBetween(metrics.HopEnqueueToStart, string(w.cfg.Channel), it.env.FirstSeen, now)
	}
	return true
}

// lostClaim settles a message whose claim found the row moved on: another
// delivery of the same message won it, or it was canceled or expired between
// read and claim.
func (w *Worker) lostClaim(it *item) {
	w.counts.duplicates.Add(1)
	w.m.Duplicate(string(w.cfg.Channel), metrics.DupClaim)
	it.done = true
}

// sendClaimed sends and records the claimed attempts, or returns them when
// one waits for a rate-limit slot (sendPaced sends them).
func (w *Worker) sendClaimed(ctx context.Context, sending []*item, now time.Time) (paced []*item) {
	if len(sending) == 0 {
		return nil
	}
	faults.Inject(faults.WorkerAfterClaim)
	for _, it := range sending {
		if it.sendAt.After(now) {
			return sending
		}
	}
	w.sendAndRecord(ctx, sending)
	return nil
}

// sendAndRecord sends claimed attempts (each at its slot, if it has one),
// records their outcomes in one statement and hands retries to their tier.
func (w *Worker) sendAndRecord(ctx context.Context, sending []*item) {

	var wg sync.WaitGroup
	for _, it := range sending {
		wg.Go(func() { w.send(ctx, it) })
	}
	wg.Wait()
	faults.Inject(faults.WorkerAfterSend)

	if ctx.Err() != nil {
		// The grace period ran out and our own cancel cut the sends short:
		// their outcome is unknown. Record nothing; the send leases expire
		// and the reconciler retries them with the same idempotency key.
		return
	}
	outs := make([]store.Outcome, len(sending))
	for i, it := range sending {
		outs[i] = it.out
	}
	var moved map[int64]bool
	if err := w.retryDB(ctx, "recording outcomes", func() (err error) {
		moved, err = w.store.RecordOutcomes(context.WithoutCancel(ctx), w.clock.Now(), outs, w.cfg.Name)
		return err
	}); err != nil {
		return // the send lease expires; the reconciler retries with the same idempotency key
	}
	faults.Inject(faults.WorkerAfterRecord)
	var retries []*item
	ch := string(w.cfg.Channel)
	recorded := w.clock.Now()
	for _, it := range sending {
		if !moved[it.row.ID] {
			w.counts.stale.Add(1) // the lease was taken over; its new holder decides
			w.m.Duplicate(ch, metrics.DupStale)
			it.done = true
			continue
		}
		w.with(w.log.Debug(), it).Str("state", string(it.out.State())).Str("reason", it.out.Reason).Msg("attempt recorded")
		if it.out.State() == reminder.Failed {
			w.with(w.log.Warn(), it).Str("reason", it.out.Reason).Msg("reminder failed")
		}
		switch it.out.State() {
		case reminder.Delivered, reminder.Failed, reminder.Expired:
			w.m.Outcome(ch, string(it.out.State()), it.code)
			w.m.HopBetween(metrics.HopStartToTerminal, ch, it.claimedAt, recorded)
		case reminder.Retrying:
			w.m.Retry(ch, it.code)
		}
		switch it.out.State() {
		case reminder.Delivered:
			w.counts.delivered.Add(1)
			it.done = true
		case reminder.Failed:
			w.counts.failed.Add(1)
			it.done = true
		case reminder.Expired:
			w.counts.expired.Add(1)
			it.done = true
		case reminder.Quarantined:
			w.counts.quarantined.Add(1)
			w.deadLetter(ctx, it, it.out.Reason)
		case reminder.Retrying:
			retries = append(retries, it)
		}
	}
	if len(retries) > 0 {
		w.publishRetries(ctx, retries)
	}
}

// admit reserves fleet-wide send slots for the messages about to be claimed,
// one round trip per tenant in the batch; a granted message is sent at its
// slot (at most ratelimit.Horizon ahead). What gets no slot is not waited for:
// it goes back through the retry tiers until its turn, or expires as
// rate_limited when its turn is at or past its deadline. A message that comes
// back a tier or more before its turn keeps waiting without asking.
func (w *Worker) admit(ctx context.Context, claim []store.Fenced, items []*item) ([]store.Fenced, []*item) {
	if w.fleet == nil || len(items) == 0 {
		return claim, items
	}
	ch := string(w.cfg.Channel)
	now := w.clock.Now()
	keep := make([]bool, len(items))
	var hops, waits, late []*item
	byTenant := map[string][]int{}
	var order []string
	for i, it := range items {
		if nb := it.env.NotBefore; !nb.IsZero() && w.topo.TierAtMost(nb.Sub(now)) > 0 {
			hops = append(hops, it)
			continue
		}
		if _, ok := byTenant[it.row.Tenant]; !ok {
			order = append(order, it.row.Tenant)
		}
		byTenant[it.row.Tenant] = append(byTenant[it.row.Tenant], i)
	}
	for _, tenant := range order {
		// Messages that waited before are served first, in turn order.
		idx := byTenant[tenant]
		sort.SliceStable(idx, func(a, b int) bool {
			na, nb := items[idx[a]].env.NotBefore, items[idx[b]].env.NotBefore
			if na.IsZero() != nb.IsZero() {
				return !na.IsZero()
			}
			return na.Before(nb)
		})
		fresh := 0
		for _, i := range idx {
			if items[i].env.NotBefore.IsZero() {
				fresh++
			}
		}
		g, err := w.fleet.Acquire(ctx, w.clock.Now(), ch, tenant, len(idx), fresh)
		if err != nil {
			w.log.Warn().Err(err).Str("tenant", tenant).Msg("rate limiter unavailable; giving the messages back")
			continue // not kept, not settled: nacked and redelivered
		}
		granted := g.Granted(len(idx))
		var waited, queued int
		for k, i := range idx {
			it := items[i]
			if k < granted {
				keep[i] = true
				if !g.Unlimited {
					it.sendAt = g.Slots[k]
				}
				continue
			}
			// The k-th message past its flow's next turn can expect its
			// slot k intervals (at the flow's cap) later, at the earliest.
			var turn time.Time
			if it.env.NotBefore.IsZero() {
				turn = g.QueueAt.Add(time.Duration(queued) * g.Spacing)
				queued++
			} else {
				turn = g.NextAt.Add(time.Duration(waited) * g.Spacing)
				waited++
			}
			if !turn.Before(it.row.Deadline) {
				late = append(late, it)
				continue
			}
			it.env.NotBefore = turn
			waits = append(waits, it)
			w.m.RateLimitDeferral(ch, "fleet")
		}
	}
	if len(late) > 0 {
		fs := fenced(late)
		if err := w.retryDB(ctx, "expiring rate-limited reminders", func() error {
			moved, err := w.store.ExpireEarly(ctx, now, fs, w.cfg.Name, "rate_limited: no capacity before the deadline")
			w.m.Outcomes(ch, string(reminder.Expired), "rate_limited", len(moved))
			return err
		}); err == nil {
			for _, it := range late {
				it.done = true
			}
		}
	}
	if len(waits) > 0 {
		untils := make([]time.Time, len(waits))
		for i, it := range waits {
			untils[i] = it.env.NotBefore
		}
		if err := w.retryDB(ctx, "deferring rate-limited reminders", func() error {
			_, err := w.store.Defer(ctx, now, fenced(waits), untils)
			return err
		}); err == nil {
			hops = append(hops, waits...)
		}
	}
	w.waitForTurns(ctx, now, hops)

	var outClaim []store.Fenced
	var outItems []*item
	for i, it := range items {
		if keep[i] {
			outClaim = append(outClaim, claim[i])
			outItems = append(outItems, it)
		}
	}
	return outClaim, outItems
}

// waitForTurns hands rate-limited messages back through the retry tiers
// towards their turns (env.NotBefore), in hops of the longest tier that does
// not overshoot, so each comes back at or just before its turn.
func (w *Worker) waitForTurns(ctx context.Context, now time.Time, its []*item) {
	byTier := map[time.Duration][]*item{}
	var tiers []time.Duration
	for _, it := range its {
		tier := max(w.topo.TierAtMost(it.env.NotBefore.Sub(now)), w.topo.RetryTiers[0])
		if _, ok := byTier[tier]; !ok {
			tiers = append(tiers, tier)
		}
		byTier[tier] = append(byTier[tier], it)
	}
	for _, tier := range tiers {
		w.deferMany(ctx, byTier[tier], tier)
	}
}

func fenced(its []*item) []store.Fenced {
	out := make([]store.Fenced, len(its))
	for i, it := range its {
		out[i] = store.Fenced{ID: it.row.ID, Fence: it.row.Fence}
	}
	return out
}

// send calls the provider for one claimed attempt and decides the outcome.
func (w *Worker) send(ctx context.Context, it *item) {
	it.out = store.Outcome{ReminderID: it.row.ID, Fence: it.att.Fence, AttemptID: it.att.AttemptID}
	defer func() {
		if p := recover(); p != nil {
			// A bug in the adapter or a template met this reminder: park it.
			it.out.Code, it.out.Attempt, it.code = reminder.CodeSendPanicked, reminder.OutcomePanicked, "panic"
			it.out.Error = fmt.Sprintf("panic: %v", p)
			it.out.Reason = "quarantined: the send panicked: " + fmt.Sprint(p)
		}
	}()
	if !it.sendAt.IsZero() && !w.awaitSlot(ctx, it) {
		// No send slot in time: nothing was sent. Hand it back as a retry
		// (the claim counted an attempt), or expire it at its deadline.
		next := w.clock.Now().Add(w.topo.RetryTiers[0])
		it.out.Attempt, it.out.Error, it.code = reminder.OutcomeNotSent, "not sent: no rate-limit slot in time", "slot_missed"
		if !next.Before(it.row.Deadline) {
			it.out.Code, it.out.Reason = reminder.CodeNoCapacity, "rate_limited: no capacity before the deadline"
			return
		}
		it.out.Code, it.out.NextAttemptAt = reminder.CodeRetry, &next
		it.out.Reason = "rate_limited: send slot missed; retrying"
		return
	}
	start := w.clock.Now()
	if !start.Before(it.row.Deadline) {
		it.out.Code, it.out.Attempt = reminder.CodeDeadlineBeforeSend, reminder.OutcomeNotSent
		it.out.Error, it.out.Reason = "not sent", "deadline reached before the send started"
		it.code = "deadline"
		return
	}
	sctx, cancel := context.WithTimeout(ctx, w.cfg.SendTimeout)
	defer cancel()
	id, err := w.sender.Send(sctx, provider.Message{
		ReminderID: it.row.ID, IdempotencyKey: it.row.IdempotencyKey, Tenant: it.row.Tenant,
		Recipient: it.row.Recipient, Template: it.row.Template, Data: it.row.Data, Deadline: it.row.Deadline,
	})
	if err == nil {
		it.out.Code, it.out.Attempt, it.out.ProviderID = reminder.CodeDelivered, reminder.OutcomeDelivered, id
		it.out.Reason, it.code = "delivered", "delivered"
		return
	}
	pe := provider.Classify(err)
	it.code = pe.Code
	it.out.Error = pe.Error()
	if pe.Kind == provider.Permanent {
		it.out.Code, it.out.Attempt = reminder.CodePermanentFailure, pe.Outcome()
		it.out.Reason = "permanent failure: " + pe.Code
		return
	}
	it.out.Attempt = pe.Outcome()
	if it.att.Number >= w.cfg.MaxAttempts {
		it.out.Code = reminder.CodeAttemptsExhausted
		it.out.Reason = fmt.Sprintf("attempts exhausted (%d): %s", it.att.Number, pe.Code)
		return
	}
	delay := w.topo.Tier(w.backoff(it.att.Number, pe.RetryAfter))
	next := w.clock.Now().Add(delay)
	if !next.Before(it.row.Deadline) {
		it.out.Code = reminder.CodeDeadlineBeforeRetry
		it.out.Reason = "deadline would pass before the next attempt: " + pe.Code
		return
	}
	it.out.Code, it.out.NextAttemptAt = reminder.CodeRetry, &next
	it.out.Reason = fmt.Sprintf("retry %d in %s: %s", it.att.Number, delay, pe.Code)
}

// awaitSlot waits for the message's reserved send slot (at most
// ratelimit.Horizon ahead). A slot is good for ratelimit.SendJitter after its
// time: a send that could not start by then (a slow claim, a stalled process)
// would reach the provider in a later window than the limiter allowed for,
// bunched with that window's own sends, so it reserves a new slot instead and
// waits for that one, but not for longer than maxSlotWait: the attempt is
// claimed, and its send lease must not run out while it waits. It returns
// true when the send may start (or ctx ended, or the deadline passed: send
// then stops or expires it), false when it gave up waiting.
func (w *Worker) awaitSlot(ctx context.Context, it *item) bool {
	ch := string(w.cfg.Channel)
	over := func(now time.Time) bool { return ctx.Err() != nil || !now.Before(it.row.Deadline) }
	giveUp := time.Time{}
	for {
		sleep(ctx, it.sendAt.Sub(w.clock.Now()))
		now := w.clock.Now()
		if over(now) || now.Sub(it.sendAt) <= ratelimit.SendJitter {
			return true
		}
		w.m.RateLimitDeferral(ch, "slot_missed")
		w.counts.slotsMissed.Add(1)
		if giveUp.IsZero() {
			giveUp = now.Add(w.maxSlotWait())
		}
		for {
			g, err := w.fleet.Acquire(ctx, now, ch, it.row.Tenant, 1, 0)
			if err == nil && g.Unlimited {
				return true // the limits were reloaded without this channel
			}
			if err == nil && len(g.Slots) == 1 {
				it.sendAt = g.Slots[0]
				break
			}
			wait := 100 * time.Millisecond
			if err != nil {
				w.log.Warn().Err(err).Msg("rate limiter unavailable; asking again for a send slot")
			} else {
				wait = g.NextAt.Sub(now)
			}
			if now.Add(wait).After(giveUp) {
				return false
			}
			sleep(ctx, wait)
			if now = w.clock.Now(); over(now) {
				return true
			}
		}
	}
}

// maxSlotWait bounds how long a claimed attempt waits for a new slot after
// missing its own: well inside the send lease, so the reconciler never takes
// over an attempt that is still about to be sent.
func (w *Worker) maxSlotWait() time.Duration {
	return min(5*time.Second, w.cfg.SendLease/4)
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// backoff is bounded exponential backoff with equal jitter, never shorter
// than the provider's Retry-After.
func (w *Worker) backoff(attempt int, retryAfter time.Duration) time.Duration {
	d := w.cfg.BackoffBase << min(attempt-1, 30)
	if d <= 0 || d > w.cfg.BackoffMax {
		d = w.cfg.BackoffMax
	}
	d = d/2 + time.Duration(w.rand()*float64(d/2))
	return max(d, retryAfter)
}

func (w *Worker) retryMessage(it *item, fence int64, delay time.Duration) broker.Outgoing {
	env := it.env
	env.Fence = fence
	env.Attempt = it.att.Number
	body, headers, err := w.keys.Seal(env)
	if err != nil {
		panic(err) // an Envelope always encodes
	}
	return broker.Outgoing{
		Exchange:   "",
		RoutingKey: w.topo.RetryQueue(string(w.cfg.Channel), delay),
		Msg: amqp.Publishing{
			MessageId:   fmt.Sprintf("%d-%d-r", env.ReminderID, fence),
			ContentType: "application/json",
			Timestamp:   w.clock.Now(),
			Headers:     headers,
			Body:        body,
		},
	}
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
			it.done = true
		}
	}
	if err != nil {
		w.log.Warn().Err(err).Int("count", len(its)).Msg("retry publish failed; the reconciler will republish")
	}
}

// defer_ sends a message that arrived before its reminder is due (clock skew,
// an early replay) back through the retry tier covering the wait.
func (w *Worker) defer_(ctx context.Context, it *item, wait time.Duration) {
	w.deferMany(ctx, []*item{it}, wait)
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
			it.done = true
		}
	}
}

// deadLetter moves a message the worker must not process to the channel's
// dead-letter queue with headers that explain it, then marks it settled. If
// that publish fails it rejects without requeue, so the queue's own
// dead-letter exchange takes it.
func (w *Worker) deadLetter(ctx context.Context, it *item, reason string) {
	d := it.d
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	count := deliveryCount(d) + 1
	headers[message.HeaderReason] = reason
	headers[message.HeaderReceiveCount] = count
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
			MessageId: d.MessageId, ContentType: d.ContentType, Timestamp: d.Timestamp,
			Headers: headers, Body: d.Body,
		},
	}
	if out.Msg.MessageId == "" {
		out.Msg.MessageId = fmt.Sprintf("dead-%d", d.DeliveryTag)
	}
	w.with(w.log.Warn().Str("reason", reason), it).Msg("dead-lettering message")
	results, err := w.pub.PublishBatch(ctx, []broker.Outgoing{out})
	if err == nil && results[0] == nil {
		w.counts.dead.Add(1)
		w.m.DeadLettered(string(w.cfg.Channel), metrics.Reason(reason))
		it.done = true
		return
	}
	if err := d.Reject(false); err == nil {
		it.rejected = true
		w.counts.dead.Add(1)
		w.m.DeadLettered(string(w.cfg.Channel), metrics.Reason(reason))
	}
}

// retryDB runs op until it succeeds, retrying transient failures with
// backoff for up to a minute or until ctx ends.
func (w *Worker) retryDB(ctx context.Context, what string, op func() error) error {
	backoff := 50 * time.Millisecond
	deadline := time.Now().Add(time.Minute)
	for {
		err := op()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			w.log.Error().Err(err).Str("op", what).Msg("database operation failed; leaving deliveries unacked")
			return err
		}
		w.log.Warn().Err(err).Str("op", what).Dur("retry_in", backoff).Msg("database operation failed; retrying")
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}
