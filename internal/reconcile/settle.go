package reconcile

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// This file settles unknown outcomes at the deadline (issue 16). A reminder
// whose deadline passes while one of its attempts has an unknown outcome (a
// timeout after the provider accepted, a worker killed after the request
// left) may have reached the recipient: expiring it would make the record
// contradict the phone. So before expiring such a reminder of a channel it
// can ask (Lookup.Lookers: SMS), the reconciler asks the provider each
// unknown attempt went to (delivery_attempts.provider): found, the reminder
// ends delivered with code settled_by_lookup; the provider has nothing (or
// holds it failed for good), it expires as before. A provider that cannot
// answer leaves the reminder as it is, to be asked again next pass, for at
// most Lookup.Hold past its deadline, after which it expires anyway, its
// reason saying the outcome is unknown. Nothing is ever sent: the deadline
// has passed.

// Defaults of Lookup's zero values.
const (
	// DefaultHold bounds how long past its deadline a reminder waits for
	// its provider to answer. An hour outlasts most provider incidents (a
	// lookup is a read: it recovers with the API), yet the reminder still
	// reaches a final state the same day; nothing can be sent meanwhile,
	// so waiting costs only a late final state.
	DefaultHold = time.Hour
	// DefaultLookupBudget bounds the time one pass spends asking, so a
	// provider that hangs cannot hold back the pass's other repairs for
	// long; what is not asked waits for the next pass.
	DefaultLookupBudget = 20 * time.Second
	// DefaultLookupTimeout bounds one lookup.
	DefaultLookupTimeout = 5 * time.Second
	// DefaultLookupConcurrency is how many lookups a pass has in flight.
	DefaultLookupConcurrency = 8
)

// Lookup configures settling by lookup. The zero value settles nothing:
// ExpireOverdue expires as it always did.
type Lookup struct {
	// Lookers ask each channel's provider (the same adapters its worker
	// sends through). Empty: no lookups.
	Lookers map[reminder.Channel]provider.Looker
	// Hold: zero means DefaultHold.
	Hold time.Duration
	// Budget: zero means DefaultLookupBudget.
	Budget time.Duration
	// Timeout: zero means DefaultLookupTimeout.
	Timeout time.Duration
	// Concurrency: zero means DefaultLookupConcurrency.
	Concurrency int
}

// WithDefaults fills the zero values.
func (l Lookup) WithDefaults() Lookup {
	l.Hold = cmp.Or(l.Hold, DefaultHold)
	l.Budget = cmp.Or(l.Budget, DefaultLookupBudget)
	l.Timeout = cmp.Or(l.Timeout, DefaultLookupTimeout)
	l.Concurrency = cmp.Or(l.Concurrency, DefaultLookupConcurrency)
	return l
}

// hold is what ExpireOverdue keeps back for lookups, looked aside.
func (l Lookup) hold(looked []int64) store.Hold {
	h := store.Hold{For: l.Hold, Looked: looked}
	for ch := range l.Lookers {
		h.Channels = append(h.Channels, ch)
	}
	return h
}

// settlement is what a lookup at the deadline decides.
type settlement int

const (
	// settleDelivered: the provider holds the message.
	settleDelivered settlement = iota
	// settleExpire: the provider has nothing (or holds it failed for
	// good): the reminder expires.
	settleExpire
	// settleHold: the provider could not answer: asked again next pass.
	settleHold
)

// onLookup decides from a lookup's answer.
func onLookup(err error) settlement {
	switch {
	case err == nil:
		return settleDelivered
	case errors.Is(err, provider.ErrNotFound), provider.Classify(err).Kind == provider.Permanent:
		return settleExpire
	}
	return settleHold
}

// reasonSettled is the reason of a reminder settled by lookup.
const reasonSettled = "settled by lookup: the deadline passed while an attempt's outcome was unknown, and the provider holds its message"

// settle asks the providers about the reminders ExpireOverdue holds, records
// those found as delivered, and returns the ids of those the providers have
// nothing of (to expire now).
func (r *Reconciler) settle(ctx context.Context, batch int, sum *Summary) ([]int64, error) {
	l := r.Lookup.WithDefaults()
	if len(l.Lookers) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.Budget)
	defer cancel()
	var looked, skip []int64
	var heldErr error // the first lookup that could not be answered, logged once a pass
	var heldID int64
	defer func() {
		if heldErr != nil {
			r.Log.Warn().Err(heldErr).Int64("reminder_id", heldID).Int("held", sum.LookupsHeld).
				Msg("the provider could not be asked about unknown outcomes at the deadline; asking again next pass")
		}
	}()
	for ctx.Err() == nil {
		rows, err := r.Store.UnknownAtDeadline(ctx, r.Clock.Now(), l.hold(nil), batch, skip)
		if err != nil {
			return looked, err
		}
		if len(rows) == 0 {
			break
		}
		ids := make([]int64, len(rows))
		for i, o := range rows {
			ids[i] = o.ID
			skip = append(skip, o.ID)
		}
		unknown, err := r.Store.UnknownAttempts(ctx, ids, nil)
		if err != nil {
			return looked, err
		}
		found, errs := r.lookAll(ctx, l, rows, unknown)
		var settled []store.Settled
		for i, o := range rows {
			switch onLookup(errs[i]) {
			case settleDelivered:
				settled = append(settled, store.Settled{Fenced: store.Fenced{ID: o.ID, Fence: o.Fence},
					Reason: fmt.Sprintf("%s (message %s)", reasonSettled, found[i])})
			case settleExpire:
				looked = append(looked, o.ID)
				sum.LookedUpNotFound++
			case settleHold:
				sum.LookupsHeld++
				if heldErr == nil {
					heldErr, heldID = errs[i], o.ID
				}
			}
		}
		if len(settled) > 0 {
			moved, err := r.Store.SettledByLookup(context.WithoutCancel(ctx), r.Clock.Now(), settled, r.Actor)
			for _, o := range rows {
				if moved[o.ID] {
					sum.SettledByLookup++
					if sum.SettledBy == nil {
						sum.SettledBy = map[reminder.Channel]int{}
					}
					sum.SettledBy[o.Channel]++
				}
			}
			if err != nil {
				return looked, err
			}
		}
		if len(rows) < batch {
			break
		}
	}
	return looked, nil
}

// lookAll asks the provider of each row about its unknown attempts, at most
// l.Concurrency at a time, each within l.Timeout.
func (r *Reconciler) lookAll(ctx context.Context, l Lookup, rows []store.Overdue, unknown map[int64][]store.UnknownAttempt) ([]string, []error) {
	found, errs := make([]string, len(rows)), make([]error, len(rows))
	sem := make(chan struct{}, l.Concurrency)
	var wg sync.WaitGroup
	for i, o := range rows {
		looker := l.Lookers[o.Channel]
		as := unknown[o.ID]
		if looker == nil || len(as) == 0 {
			errs[i] = fmt.Errorf("reminder %d: %w", o.ID, provider.ErrNotFound) // nothing to ask about: no attempt is unknown any more
			continue
		}
		msg := provider.Message{ReminderID: o.ID, IdempotencyKey: o.IdempotencyKey, Tenant: o.Tenant,
			Recipient: o.Recipient, Deadline: o.Deadline, Earlier: store.Earlier(as)}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			lctx, cancel := context.WithTimeout(ctx, l.Timeout)
			defer cancel()
			found[i], errs[i] = looker.Lookup(lctx, msg)
		})
	}
	wg.Wait()
	return found, errs
}
