package worker

import (
	"context"
	"time"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Store is what the worker needs of the database, and no more: each method
// is one batched, fenced statement that takes @now from the caller.
// *store.Store satisfies it.
type Store interface {
	// LoadForDelivery reads the rows of the given reminders.
	LoadForDelivery(ctx context.Context, ids []int64) (map[int64]store.Delivery, error)
	// ClaimForDelivery claims an attempt for each reminder of channel still
	// at its fence, due and before its deadline, and returns the rows as
	// they were before the claim.
	ClaimForDelivery(ctx context.Context, now time.Time, channel reminder.Channel, provider string, fs []store.Fenced, lease time.Duration, actor string) (map[int64]store.Delivery, map[int64]store.Attempt, error)
	// ExpireFenced expires reminders whose deadline is reached, at their fences.
	ExpireFenced(ctx context.Context, now time.Time, fs []store.Fenced, actor, reason string) (map[int64]bool, error)
	// ExpireEarly expires reminders that cannot be sent before their deadline.
	ExpireEarly(ctx context.Context, now time.Time, fs []store.Fenced, actor, reason string) (map[int64]bool, error)
	// ExpireNoWindow expires reminders whose send window does not open before their deadline.
	ExpireNoWindow(ctx context.Context, now time.Time, fs []store.Fenced, actor, reason string) (map[int64]bool, error)
	// Defer records each reminder's rate-limit turn (or send window opening).
	Defer(ctx context.Context, now time.Time, fs []store.Fenced, untils []time.Time) (map[int64]bool, error)
	// Quarantine parks reminders for an operator.
	Quarantine(ctx context.Context, now time.Time, fs []store.Fenced, actor, reason string) (map[int64]bool, error)
	// RecordOutcomes records attempts' outcomes under their attempt fences.
	RecordOutcomes(ctx context.Context, now time.Time, os []store.Outcome, actor string) (map[int64]bool, error)
	// UnknownAttempts reads the reminders' attempts of unknown outcome,
	// other than the attempts except.
	UnknownAttempts(ctx context.Context, ids, except []int64) (map[int64][]store.UnknownAttempt, error)
	// AttemptProvider records the provider an attempt's request goes to,
	// when failover sends it elsewhere than its claim recorded.
	AttemptProvider(ctx context.Context, id int64, provider string) error
	// FoundAtProvider records waiting reminders delivered: the provider
	// holds an earlier attempt's message.
	FoundAtProvider(ctx context.Context, now time.Time, fs []store.Fenced, actor, reason string) (map[int64]bool, error)
	// NoteEvents appends a note (an event that is not a transition) to the
	// timelines of the existing reminders among ids.
	NoteEvents(ctx context.Context, now time.Time, code reminder.Code, ids []int64, reasons []string, actor string) (int64, error)
}

var _ Store = (*store.Store)(nil)

// publisher publishes with confirms (*broker.Publisher): results[i] is nil
// once msgs[i] is confirmed.
type publisher interface {
	PublishBatch(ctx context.Context, msgs []broker.Outgoing) (results []error, err error)
	// Blocked reports whether the broker blocks publishing (a resource alarm).
	Blocked() (bool, string)
	Close()
}

var _ publisher = (*broker.Publisher)(nil)

// retryDB runs op until it succeeds, retrying transient failures with
// backoff, waited on the worker's clock, for up to a minute of it or until
// ctx ends.
func (w *Worker) retryDB(ctx context.Context, what string, op func() error) error {
	backoff := 50 * time.Millisecond
	deadline := w.clock.Now().Add(time.Minute)
	for {
		err := op()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || w.clock.Now().After(deadline) {
			w.log.Error().Err(err).Str("op", what).Msg("database operation failed; leaving deliveries unacked")
			return err
		}
		w.log.Warn().Err(err).Str("op", what).Dur("retry_in", backoff).Msg("database operation failed; retrying")
		_ = clock.Sleep(ctx, w.clock, backoff)
		backoff = min(backoff*2, 5*time.Second)
	}
}

// fenced lists the items' rows at the fences they were read with.
func fenced(its []*item) []store.Fenced {
	out := make([]store.Fenced, len(its))
	for i, it := range its {
		out[i] = store.Fenced{ID: it.row.ID, Fence: it.row.Fence}
	}
	return out
}
