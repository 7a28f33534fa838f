package fleet

import (
	"context"
	"time"

	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/dispatch"
)

// Dispatcher is what the dispatcher binary's flags fill in.
type Dispatcher struct {
	Common config.Common
	Config dispatch.Config
	// Every, when positive, runs passes in a loop instead of once: each as
	// soon as the next pending reminder is due, at most Every and at least
	// Config.MinGap after the last one started (dispatch.Dispatcher.Loop).
	Every time.Duration
	// Pushgateway is where each run's summary is pushed (empty: nowhere).
	Pushgateway string
}

// RegisterFlags adds the dispatcher's flags to fs.
func (o *Dispatcher) RegisterFlags(fs *pflag.FlagSet) {
	o.Common.RegisterDB(fs)
	o.Common.RegisterBroker(fs)
	def := dispatch.Config{}.WithDefaults()
	fs.IntVar(&o.Config.Batch, "batch", def.Batch, "reminders claimed per batch")
	fs.DurationVar(&o.Config.Lease, "lease", def.Lease,
		"how long a claim's rows stay enqueued under its dispatch lease before the reconciler may return unconfirmed ones to pending")
	fs.DurationVar(&o.Config.Budget, "budget", def.Budget,
		"time budget of one run; keep it below the CronJob's activeDeadlineSeconds")
	fs.IntVar(&o.Config.EnvelopeSize, "envelope-size", def.EnvelopeSize,
		"most reminders of one channel per broker message, a claim's split evenly (1 to 200, at most the envelope limit: 100 until nudgectl migrate --after-rollout applies schema 49; above 1, batch envelopes, which workers older than them dead-letter: docs/deploy.md)")
	// 0, not def's 200: the default follows --envelope-size (1 there: 1 here).
	fs.IntVar(&o.Config.BurstEnvelopeSize, "burst-envelope-size", 0,
		"reminders of one channel per broker message while a run works off a burst (due rows left after a claim); 0: 200, or 1 with --envelope-size 1; never below --envelope-size; at most the envelope limit: 100 until nudgectl migrate --after-rollout applies schema 49 (docs/operations.md)")
	fs.DurationVar(&o.Config.PromoteAhead, "promote-ahead", def.PromoteAhead,
		"H of the due-ordered store: each run first inserts the state rows of lazy reminders due up to H ahead (bounded by the database's clock and lazy intake's horizon: docs/deploy.md, schema 38)")
	fs.IntVar(&o.Config.PromoteBatch, "promote-batch", def.PromoteBatch,
		"lazy reminders one promoter pass reads at most (a run catching up runs one pass before each claim)")
	fs.DurationVar(&o.Every, "every", 0,
		"run in a loop instead of once: a pass as soon as the next pending reminder is due, at most DURATION after the last one started (compose, a long-running dispatcher)")
	fs.DurationVar(&o.Config.MinGap, "min-gap", def.MinGap,
		"with --every, the least time between the starts of two passes: a steady stream of due reminders is claimed a pass every --min-gap")
	fs.DurationVar(&o.Config.PromoteEvery, "promote-every", def.PromoteEvery,
		"with --every, the least time between two promoter passes while the cutoff stays below the promoter's final watermark (a pass within it claims without one); negative: one before every pass")
	fs.StringVar(&o.Pushgateway, "pushgateway", "", "Prometheus Pushgateway address to push each run's summary to (empty: none)")
}

// Run runs one dispatch pass (or, with Every, passes in a loop until ctx
// ends), records each run in dispatch_runs and pushes its summary (a loop's
// passes merged: at most one row a second).
func (o *Dispatcher) Run(ctx context.Context, env Env) error {
	p, err := startPublishing(ctx, &o.Common, "dispatcher", dispatcherTimeouts, env)
	if err != nil {
		return err
	}
	defer p.close()
	d := &dispatch.Dispatcher{
		Enqueuer: p.enqueuer,
		Config:   o.Config,
		Log:      env.Log,
		AfterRun: dispatch.Report(p.pool, p.enqueuer.Actor, env.Clock, o.Pushgateway, env.Registry, env.Log),
	}
	if o.Every > 0 {
		return d.Loop(ctx, o.Every)
	}
	sum, err := d.RunOnce(ctx)
	d.LogSummary(sum, err)
	d.AfterRun(ctx, sum, err)
	return err
}
