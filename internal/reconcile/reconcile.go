// Package reconcile repairs from the table what a crash, an outage or a lost
// message left behind. The table is the source of truth and a queue that
// looks empty proves nothing, so each pass asks the table: what is past its
// deadline (expire it), what lease expired with its holder gone (return it to
// pending), and what was published or retried but never picked up, or was
// being sent when its worker died (lease it again under a new fence and
// publish it again: the old message, if it still exists, is now superseded,
// and the provider sees the same idempotency key).
package reconcile

import (
	"cmp"
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/retention"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Config tunes the reconciler.
type Config struct {
	// Batch bounds each statement. Zero value: 500.
	Batch int
	// Overdue is how long an enqueued reminder may wait for a worker (or a
	// retrying one past its next attempt time) before its message is
	// presumed lost and republished. Set it above the queue's normal
	// backlog age: republishing early is harmless (fenced) but wasteful.
	// Zero value: 10 minutes.
	Overdue time.Duration
	// Lease is the lease taken while republishing. Zero value: 2 minutes.
	Lease time.Duration
}

// WithDefaults returns c with each zero (or negative) field set to its
// default. It is the one place the defaults are written: the reconciler's
// flags (internal/fleet) take theirs from it.
func (c Config) WithDefaults() Config {
	if c.Batch <= 0 {
		c.Batch = 500
	}
	if c.Overdue <= 0 {
		c.Overdue = 10 * time.Minute
	}
	if c.Lease <= 0 {
		c.Lease = 2 * time.Minute
	}
	return c
}

// Defaults of the loop's intervals (Loop's every, Reconciler.CleanEvery).
const (
	DefaultEvery      = 10 * time.Second
	DefaultCleanEvery = 10 * time.Minute
)

// Cleaner is the retention pass the reconciler runs now and then
// (*retention.Cleaner).
type Cleaner interface {
	Pass(ctx context.Context) (retention.Summary, error)
}

// Reconciler runs repair passes.
type Reconciler struct {
	dispatch.Enqueuer
	Config Config
	Log    zerolog.Logger
	// Cleaner, when set, runs every CleanEvery (zero value:
	// DefaultCleanEvery) between repair passes.
	Cleaner    Cleaner
	CleanEvery time.Duration

	lastOK atomic.Int64 // unix nanoseconds of the last pass that succeeded
}

// Ready reports whether a pass succeeded recently (within three intervals
// of every): a reconciler that cannot reach the database or the broker is
// not doing its job and says so.
func (r *Reconciler) Ready(every time.Duration) func() bool {
	return func() bool {
		last := r.lastOK.Load()
		return last != 0 && r.Clock.Now().Sub(time.Unix(0, last)) < 3*every+5*time.Second
	}
}

// Summary counts what one pass repaired.
type Summary struct {
	Expired int
	// Released were enqueued (or, left by a version before schema 7,
	// leased) under a dispatch lease that ran out with no publish
	// confirmation recorded: back to pending.
	Released int
	// InQueue were enqueued under a dispatch lease that ran out after their
	// publish was confirmed: their lease was cleared, they wait in the queue.
	InQueue     int
	Republished int
	// Quarantined were republished store.MaxRepublishes times without any
	// outcome: their message crashes whatever consumes it.
	Quarantined int
	Elapsed     time.Duration
}

// maxRounds bounds one pass so a huge backlog cannot keep it running forever.
const maxRounds = 100

// Pass runs one repair pass.
func (r *Reconciler) Pass(ctx context.Context) (Summary, error) {
	cfg := r.Config.WithDefaults()
	start := r.Clock.Now()
	var sum Summary
	defer func() { sum.Elapsed = r.Clock.Now().Sub(start) }()

	for range maxRounds {
		n, err := r.Store.ExpireOverdue(ctx, r.Clock.Now(), cfg.Batch, r.Actor)
		sum.Expired += n
		if err != nil {
			return sum, err
		}
		if n < cfg.Batch {
			break
		}
	}
	for range maxRounds {
		released, cleared, err := r.Store.ResolveExpiredLeases(ctx, r.Clock.Now(), cfg.Batch, r.Actor)
		sum.Released += released
		sum.InQueue += cleared
		if err != nil {
			return sum, err
		}
		if released+cleared < cfg.Batch {
			break
		}
	}
	for range maxRounds {
		claimed, err := r.Store.Reclaim(ctx, r.Clock.Now(), cfg.Overdue, cfg.Batch, cfg.Lease, r.Actor)
		if err != nil {
			return sum, err
		}
		for _, c := range claimed {
			if c.State == reminder.Quarantined {
				sum.Quarantined++
			}
		}
		res, err := r.Enqueue(ctx, claimed)
		sum.Republished += res.Enqueued
		if err != nil {
			return sum, err
		}
		if len(claimed) < cfg.Batch {
			break
		}
	}
	return sum, nil
}

// Loop starts a pass every interval until ctx is done (a pass that took
// longer is followed by the next at once), and a retention pass after the
// first repair pass and then every CleanEvery. Its pauses and its notion of
// "recently" (Ready) go through the Clock, so a test moves a fake clock
// instead of sleeping.
func (r *Reconciler) Loop(ctx context.Context, every time.Duration) error {
	var lastClean time.Time
	cleanEvery := cmp.Or(r.CleanEvery, DefaultCleanEvery)
	for {
		start := r.Clock.Now()
		sum, err := r.Pass(ctx)
		now := r.Clock.Now()
		if err == nil {
			r.lastOK.Store(now.UnixNano())
		}
		r.LogSummary(sum, err)
		r.Metrics.ReconcilePass(sum.Elapsed, err, now)
		r.Metrics.LeaseExpired(metrics.LeaseDispatch, sum.Released)
		r.Metrics.Outcomes("", string(reminder.Expired), "deadline", sum.Expired)
		if r.Cleaner != nil && (lastClean.IsZero() || now.Sub(lastClean) >= cleanEvery) && ctx.Err() == nil {
			lastClean = now
			cs, err := r.Cleaner.Pass(ctx)
			r.logClean(cs, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-clock.After(r.Clock, every-r.Clock.Now().Sub(start)):
		}
	}
}

func (r *Reconciler) logClean(cs retention.Summary, err error) {
	for kind, n := range map[string]int64{"payloads": cs.Purged, "attempts": cs.AttemptsDeleted,
		"reminders": cs.RemindersDeleted, "events": cs.EventsDeleted, "audit": cs.AuditDeleted,
		"dispatch_runs": cs.RunsDeleted, "publish_confirms": cs.ConfirmsDeleted,
		"rate_flows": cs.FlowsDeleted} {
		r.Metrics.Retention(kind, n)
	}
	ev := r.Log.Info()
	if err != nil && !errors.Is(err, context.Canceled) {
		ev = r.Log.Error().Err(err)
	}
	ev.Int64("payloads_purged", cs.Purged).Int64("attempts_deleted", cs.AttemptsDeleted).
		Int64("reminders_deleted", cs.RemindersDeleted).Int64("events_deleted", cs.EventsDeleted).
		Bool("more", cs.More).Dur("elapsed", cs.Elapsed).Msg("retention pass")
}

// LogSummary writes the one-line summary of a pass.
func (r *Reconciler) LogSummary(sum Summary, err error) {
	ev := r.Log.Info()
	if err != nil && !errors.Is(err, context.Canceled) {
		ev = r.Log.Error().Err(err)
	}
	ev.Int("expired", sum.Expired).Int("released", sum.Released).Int("in_queue", sum.InQueue).Int("republished", sum.Republished).
		Int("quarantined", sum.Quarantined).
		Dur("elapsed", sum.Elapsed).Msg("reconcile pass")
}
