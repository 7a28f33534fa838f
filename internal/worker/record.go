package worker

import (
	"context"
	"time"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/faults"
	"github.com/nudgehq/nudge/internal/store"
)

// recordAsDone records the outcomes of a batch's sends as they finish
// (done yields each item of sending once its send has decided its outcome),
// so that a reminder does not wait for the slowest send of its batch: a
// statement is written once half the batch (or all that is left of it) has
// finished, or once the first outcome in hand has waited recordWait on the
// worker's clock for the others; whatever else has finished by then goes
// with it. Sends that finish together are recorded together, in one
// statement, or two when they finish over more than recordWait.
func (w *Worker) recordAsDone(ctx context.Context, sending []*item, done <-chan *item) {
	left := len(sending)
	least := (len(sending) + recordShares - 1) / recordShares
	for left > 0 {
		sub := append(make([]*item, 0, left), <-done)
		left--
		var waited <-chan time.Time
	fill:
		for left > 0 && len(sub) < least {
			select {
			case it := <-done:
				sub = append(sub, it)
				left--
				continue
			default:
			}
			if waited == nil {
				waited = clock.After(w.clock, recordWait)
			}
			select {
			case it := <-done:
				sub = append(sub, it)
				left--
			case <-waited:
				break fill
			}
		}
	more:
		for left > 0 {
			select {
			case it := <-done:
				sub = append(sub, it)
				left--
			default:
				break more
			}
		}
		faults.Inject(faults.WorkerAfterSend)
		if ctx.Err() != nil || !w.record(ctx, sub) {
			// The grace period ran out and our own cancel cut the sends
			// short (their outcome is unknown), or the database stayed
			// down: record nothing more; the send leases expire and the
			// reconciler retries them with the same idempotency key.
			for ; left > 0; left-- {
				<-done
			}
			return
		}
	}
}

// record writes the outcomes of sub in one statement and settles them.
func (w *Worker) record(ctx context.Context, sub []*item) bool {
	outs := make([]store.Outcome, len(sub))
	for i, it := range sub {
		outs[i] = it.out
	}
	var moved map[int64]bool
	if err := w.retryDB(ctx, "recording outcomes", func() (err error) {
		moved, err = w.store.RecordOutcomes(context.WithoutCancel(ctx), w.clock.Now(), outs, w.cfg.Name)
		return err
	}); err != nil {
		return false // the send lease expires; the reconciler retries with the same idempotency key
	}
	faults.Inject(faults.WorkerAfterRecord)
	w.settleRecorded(ctx, sub, moved)
	return true
}

// recordShares: a statement waits for this share of its batch (1/2) to
// finish, unless what has finished waited recordWait for the rest.
const recordShares = 2

// recordWait is how long a finished send's outcome waits on the worker's
// clock for its batch-mates before it is recorded without them.
const recordWait = 10 * time.Millisecond
