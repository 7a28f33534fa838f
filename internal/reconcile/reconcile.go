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
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/retention"
	"github.com/nudgehq/nudge/internal/store"
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
	// Queues, when set, reads each channel's work queue (by channel) before
	// republishing: the enqueued and retrying reminders of a channel whose
	// queue has a backlog or no consumer are not republished (their
	// messages wait there; republishing would only spend the
	// store.MaxRepublishes budget and quarantine healthy work), its sending
	// ones with an expired send lease still are. Nil: every channel is
	// taken to be draining. *broker.WorkQueues's States.
	Queues func(ctx context.Context) (map[string]broker.QueueState, error)
	// Lookup, when it has Lookers, settles reminders whose deadline passed
	// while an attempt's outcome was unknown by asking their provider
	// before expiring them (settle.go). Zero value: they expire at once.
	Lookup Lookup

	lastOK     atomic.Int64 // unix nanoseconds of the last pass that succeeded
	brokerDown atomic.Bool  // the last pass could not publish
}

// Ready reports whether a pass succeeded recently (within three intervals
// of every) and the last one could publish: a reconciler that cannot reach
// the database or the broker (or that the broker blocks) is not doing its
// job and says so, while it goes on with what needs only the database.
func (r *Reconciler) Ready(every time.Duration) func() bool {
	return func() bool {
		if b, ok := r.Publisher.(interface{ Blocked() (bool, string) }); ok {
			if blocked, _ := b.Blocked(); blocked {
				return false
			}
		}
		last := r.lastOK.Load()
		return !r.brokerDown.Load() && last != 0 && r.Clock.Now().Sub(time.Unix(0, last)) < 3*every+5*time.Second
	}
}

// Summary counts what one pass repaired.
type Summary struct {
	Expired int
	// ExpiredBy counts Expired per channel.
	ExpiredBy map[reminder.Channel]int
	// SendLeasesExpired were being sent under a send lease that ran out
	// (their worker is presumed gone): expired, if past their deadline, or
	// enqueued again to be republished.
	SendLeasesExpired int
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
	// Waiting are the channels whose overdue enqueued and retrying
	// reminders were left alone this pass: their work queue has a backlog
	// or no consumer.
	Waiting []string
	// SettledByLookup were at or past their deadline with an attempt of
	// unknown outcome, and their provider holds the message: delivered
	// (SettledBy counts them per channel).
	SettledByLookup int
	SettledBy       map[reminder.Channel]int
	// LookedUpNotFound were such reminders whose provider has nothing of
	// them: expired.
	LookedUpNotFound int
	// LookupsHeld were such reminders whose provider could not be asked:
	// left for the next pass (until Lookup.Hold past their deadline).
	LookupsHeld int
	// BrokerDown is set when the pass could not publish, so it did only
	// the database's repairs (expiry, leases) and republished nothing.
	BrokerDown bool
	Elapsed    time.Duration
}

// maxRounds bounds one pass so a huge backlog cannot keep it running forever.
const maxRounds = 100

// Pass runs one repair pass.
func (r *Reconciler) Pass(ctx context.Context) (sum Summary, err error) {
	start := r.Clock.Now()
	// Named results: the deferred function sets the Elapsed that is returned
	// (with an unnamed result it set a copy, and every pass took 0 s).
	defer func() { sum.Elapsed = r.Clock.Now().Sub(start) }()
	return r.pass(ctx)
}

func (r *Reconciler) pass(ctx context.Context) (Summary, error) {
	cfg := r.Config.WithDefaults()
	var sum Summary
	// Expire what is late, except what waits for its provider's answer;
	// then ask the providers, and expire what they have nothing of.
	l := r.Lookup.WithDefaults()
	if err := r.expire(ctx, cfg.Batch, l.hold(nil), &sum); err != nil {
		return sum, err
	}
	looked, err := r.settle(ctx, cfg.Batch, &sum)
	if len(looked) > 0 {
		if err := r.expire(ctx, cfg.Batch, l.hold(looked), &sum); err != nil {
			return sum, err
		}
	}
	if err != nil {
		return sum, err
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
	// Republishing needs the broker: a row reclaimed and then not published
	// has spent one of its republishes for nothing.
	if err := r.CanPublish(ctx); err != nil {
		sum.BrokerDown = true
		return sum, err
	}
	waiting, queuesErr := r.waiting(ctx)
	sum.Waiting = waiting
	for range maxRounds {
		claimed, err := r.Store.ReclaimExcept(ctx, r.Clock.Now(), cfg.Overdue, cfg.Batch, cfg.Lease, r.Actor, waiting)
		if err != nil {
			return sum, err
		}
		for _, c := range claimed {
			if c.State == reminder.Quarantined {
				sum.Quarantined++
			}
			if c.From == reminder.Sending {
				sum.SendLeasesExpired++
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
	return sum, queuesErr
}

// expire expires the reminders at or past their deadline, but those hold
// keeps for a lookup, batch by batch.
func (r *Reconciler) expire(ctx context.Context, batch int, hold store.Hold, sum *Summary) error {
	for range maxRounds {
		exp, err := r.Store.ExpireOverdueHolding(ctx, r.Clock.Now(), batch, r.Actor, hold)
		n := 0
		for ch, e := range exp {
			n += e.Expired
			if sum.ExpiredBy == nil {
				sum.ExpiredBy = map[reminder.Channel]int{}
			}
			sum.ExpiredBy[ch] += e.Expired
			sum.SendLeasesExpired += e.SendLeaseExpired
		}
		sum.Expired += n
		if err != nil {
			return err
		}
		if n < batch {
			return nil
		}
	}
	return nil
}

// waiting returns the channels whose work queue has a backlog or no
// consumer. When the queues cannot be read, every channel is taken to be
// waiting (only expired send leases are republished) and the error returned.
func (r *Reconciler) waiting(ctx context.Context) ([]string, error) {
	if r.Queues == nil {
		return nil, nil
	}
	channels := r.Topology.WithDefaults().Channels
	states, err := r.Queues(ctx)
	if err != nil {
		return channels, fmt.Errorf("reading the work queues: %w", err)
	}
	var out []string
	for _, c := range channels {
		if st := states[c]; st.Messages > 0 || st.Consumers == 0 {
			out = append(out, c)
		}
	}
	return out, nil
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
		r.brokerDown.Store(sum.BrokerDown)
		r.LogSummary(sum, err)
		r.Record(sum, err, now)
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

// Record counts in r.Metrics what a pass that ended at now repaired.
func (r *Reconciler) Record(sum Summary, err error, now time.Time) {
	r.Metrics.ReconcilePass(sum.Elapsed, err, now)
	r.Metrics.LeaseExpired(metrics.LeaseDispatch, sum.Released)
	r.Metrics.LeaseExpired(metrics.LeaseSend, sum.SendLeasesExpired)
	for ch, n := range sum.ExpiredBy {
		r.Metrics.Outcomes(string(ch), string(reminder.Expired), metrics.ReconcilerExpiry, n)
	}
	for ch, n := range sum.SettledBy {
		r.Metrics.Outcomes(string(ch), string(reminder.Delivered), string(reminder.CodeSettledByLookup), n)
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
	ev.Int("expired", sum.Expired).Int("released", sum.Released).Int("in_queue", sum.InQueue).Int("republished", sum.Republished).Int("send_leases_expired", sum.SendLeasesExpired).
		Int("quarantined", sum.Quarantined).Int("settled_by_lookup", sum.SettledByLookup).
		Int("looked_up_not_found", sum.LookedUpNotFound).Int("lookups_held", sum.LookupsHeld).Strs("waiting", sum.Waiting).Bool("broker_down", sum.BrokerDown).
		Dur("elapsed", sum.Elapsed).Msg("reconcile pass")
}
