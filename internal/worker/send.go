package worker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/faults"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

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
	if !w.readUnknown(ctx, sending) {
		return // nothing sent: the send leases expire and the reconciler retries
	}
	// The sends go to the runners as tasks of one batch (an index into
	// sending), not a closure each; one watch ends their contexts if ctx
	// ends while they are in flight.
	watch := newSendWatch(ctx)
	var wg sync.WaitGroup
	wg.Add(len(sending))
	ts := &tasks{run: func(i int) {
		defer wg.Done()
		defer w.releaseSend()
		w.sendWith(ctx, watch, sending[i])
	}}
	for i := range sending {
		w.acquireSend()
		sendRunners.run(task{ts, i})
	}
	wg.Wait()
	watch.close()
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
	w.settleRecorded(ctx, sending, moved)
}

// acquireSend takes one of the worker's sendSlots, waiting for a send to
// return when all are taken; releaseSend gives it back. A Worker built
// without New has no bound.
func (w *Worker) acquireSend() {
	if w.sends != nil {
		w.sends <- struct{}{}
	}
}

func (w *Worker) releaseSend() {
	if w.sends != nil {
		<-w.sends
	}
}

// settleRecorded counts and settles the recorded attempts: terminal ones are
// acked, quarantined ones dead-lettered, retries published to their tier; an
// outcome the store did not take (moved[id] false) lost its lease.
func (w *Worker) settleRecorded(ctx context.Context, sending []*item, moved map[int64]bool) {
	var retries []*item
	ch := string(w.cfg.Channel)
	recorded := w.clock.Now()
	for _, it := range sending {
		if !moved[it.row.ID] {
			w.counts.stale.Add(1) // the lease was taken over; its new holder decides
			w.m.Duplicate(ch, metrics.DupStale)
			it.settled = toAck
			continue
		}
		w.with(w.log.Debug(), it).Str("state", string(it.out.State())).Str("reason", it.out.Reason).Msg("attempt recorded")
		w.m.HopEnded(ch, string(it.out.State()), it.claimedAt, recorded)
		switch it.out.State() {
		case reminder.Delivered, reminder.Failed, reminder.Expired:
			w.m.Outcome(ch, string(it.out.State()), it.code)
		case reminder.Retrying:
			w.m.Retry(ch, it.code)
		}
		switch it.out.State() {
		case reminder.Delivered:
			w.counts.delivered.Add(1)
			it.settled = toAck
		case reminder.Failed:
			w.with(w.log.Warn(), it).Str("reason", it.out.Reason).Msg("reminder failed")
			w.counts.failed.Add(1)
			it.settled = toAck
		case reminder.Expired:
			w.counts.expired.Add(1)
			it.settled = toAck
		case reminder.Quarantined:
			w.counts.quarantined.Add(1)
			w.deadLetter(ctx, it, verdict{kind: kindQuarantine, reason: it.out.Reason, code: it.code})
		case reminder.Retrying:
			retries = append(retries, it)
		}
	}
	if len(retries) > 0 {
		w.publishRetries(ctx, retries)
	}
}

// sendRunners runs every worker's sends in this process.
var sendRunners = runners{work: make(chan task)}

// tasks are one batch's calls: task i is run(i). Handing a runner a task
// (a pointer and an index, copied through the channel) allocates nothing,
// where a closure per send did.
type tasks struct {
	run func(i int)
}

// task is call i of a batch.
type task struct {
	ts *tasks
	i  int
}

// runnerIdle is how long a runner waits for another send before it ends.
const runnerIdle = 5 * time.Second

// runners run functions on goroutines that outlive one call: an idle runner
// takes the next call, and a new goroutine starts only when none is idle.
// A send needs a stack of 16–32 KB (its provider call renders a template
// through reflection and runs the HTTP client); a new goroutine starts with
// a few KB and the runtime grows it by copying it, adjusting every frame on
// it, three or four times per send: 7–8% of the worker's CPU profile with
// the HTTP provider (BenchmarkProcessBatch/envelope=50/sender=http), and
// the goroutine's creation on top. A runner keeps its grown stack from one
// send to the next. Runners idle for runnerIdle end, so an idle process
// keeps none.
type runners struct {
	work chan task // unbuffered: a call is handed only to an idle runner
}

// run runs t on an idle runner, or on a new one if none is idle; it does
// not wait for t to return.
func (r *runners) run(t task) {
	select {
	case r.work <- t:
	default:
		go r.loop(t)
	}
}

func (r *runners) loop(f task) {
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for {
		f.ts.run(f.i)
		f = task{} // keep nothing of the last call alive while idle
		idle.Reset(runnerIdle)
		select {
		case f = <-r.work:
		case <-idle.C:
			return
		}
	}
}

// send calls the provider for one claimed attempt and records in it.out
// what the decision steps make of it.
func (w *Worker) send(ctx context.Context, it *item) {
	watch := newSendWatch(ctx)
	defer watch.close()
	w.sendWith(ctx, watch, it)
}

// sendWith is send, for one of the sends whose contexts watch ends.
func (w *Worker) sendWith(ctx context.Context, watch *sendWatch, it *item) {
	defer func() {
		if p := recover(); p != nil {
			w.decided(it, onPanic(p), "")
		}
	}()
	if !it.sendAt.IsZero() && !w.awaitSlot(ctx, it) {
		w.unsent(ctx, it, onSlotMissed(w.clock.Now(), it.row.Deadline, w.topo.RetryTiers[0]))
		return
	}
	if v := w.mayStart(it); v.kind != kindSend {
		w.unsent(ctx, it, v)
		return
	}
	// An earlier attempt whose outcome is unknown is looked up at the
	// provider first: found, nothing is sent again.
	msg := w.message(it, it.earlier)
	if v, id := w.beforeResend(ctx, it, msg); v.kind != kindSend {
		w.decided(it, v, id) // found at the provider, or it could not tell: not sent
		return
	}
	// The call is bounded by the deadline as well as by SendTimeout: the
	// provider answers before the deadline or the call is cut (on the
	// worker's clock: the bound is the time left, not a wall-clock instant).
	// The bound is decided on the worker's clock and enforced on the wall
	// clock, as context.WithTimeout did; sctx arms a timer only if the
	// adapter waits on its Done (sendctx.go).
	sctx := &it.sctx
	sctx.start(ctx, watch, time.Now().Add(min(w.cfg.SendTimeout, it.row.Deadline.Sub(w.clock.Now()))))
	defer sctx.release()
	// The adapter runs the same check again right before the request leaves,
	// after its own waits (for SMTP, a free pooled connection and the dial);
	// the latency is measured from there, so those waits do not widen the
	// automatic margin.
	it.refused.Store(nil)
	it.opened.Store(0)
	gate := func() error {
		v := w.mayStart(it)
		if v.kind != kindSend {
			it.refused.Store(&v)
			return errors.New(v.reason)
		}
		it.opened.Store(w.clock.Now().UnixNano())
		return nil
	}
	started := w.clock.Now()
	msg.Gate, msg.Route = gate, w.route(ctx, it)
	id, err := w.sender.Send(sctx, msg)
	now := w.clock.Now()
	if v := it.refused.Load(); v != nil && err != nil {
		w.unsent(ctx, it, *v) // nothing left for the provider
		return
	}
	if o := it.opened.Load(); o != 0 {
		started = time.Unix(0, o)
	}
	w.latency.record(now.Sub(started))
	v := onAnswer(err, it.att.Number, now, it.row.Deadline, w.policy(), w.rand())
	v, found := w.settleUnknown(ctx, it, msg, v)
	if found != "" {
		id = found
	}
	w.decided(it, v, id)
}

// mayStart decides whether it's send may start now: the checks of the last
// moment before the provider call, which send runs before calling the
// adapter and the adapter again (provider.Message.Gate) immediately before
// the request leaves.
func (w *Worker) mayStart(it *item) verdict {
	now, margin := w.clock.Now(), w.deadlineMargin()
	if v := beforeSend(now, it.row.Deadline, margin); v.kind != kindSend {
		return v
	}
	// The send window, in the recipient's zone: the send must also start
	// at least the margin before the window closes.
	return onWindow(it.row.Window, it.row.Zone, now, it.row.Deadline, margin)
}

// decided turns an attempt's verdict into the outcome to record.
func (w *Worker) decided(it *item, v verdict, providerID string) {
	it.out = store.Outcome{
		ReminderID: it.row.ID, Fence: it.att.Fence, AttemptID: it.att.AttemptID,
		Code: v.transition, Attempt: v.attempt, Error: v.err, Reason: v.reason, ProviderID: providerID,
	}
	if v.kind == kindRetry {
		at := v.at
		it.out.NextAttemptAt = &at
	}
	it.code = v.code
}

// awaitSlot waits, on the worker's clock, for the message's reserved send
// slot (at most ratelimit.Horizon ahead). A slot is good for
// ratelimit.SendJitter after its time: a send that could not start by then
// (a slow claim, a stalled process) would reach the provider in a later
// window than the limiter allowed for, bunched with that window's own sends,
// so it reserves a new slot instead and waits for that one, but not for
// longer than maxSlotWait: the attempt is claimed, and its send lease must
// not run out while it waits. It returns true when the send may start (or
// ctx ended, or the deadline passed: send then stops or expires it), false
// when it gave up waiting.
func (w *Worker) awaitSlot(ctx context.Context, it *item) bool {
	ch := string(w.cfg.Channel)
	over := func(now time.Time) bool { return ctx.Err() != nil || !now.Before(it.row.Deadline) }
	giveUp := time.Time{}
	for {
		_ = clock.Sleep(ctx, w.clock, it.sendAt.Sub(w.clock.Now()))
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
			g, err := w.fleet.Reserve(ctx, now, w.flow(it), 1, 0)
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
			_ = clock.Sleep(ctx, w.clock, wait)
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
