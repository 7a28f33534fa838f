package fleet

import (
	"context"
	"time"

	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/internal/retention"
)

// Reconciler is what the reconciler binary's flags fill in.
type Reconciler struct {
	Common config.Common
	Config reconcile.Config
	// Every is the time between repair passes.
	Every time.Duration
	// Once runs one repair pass and returns.
	Once bool
	// Listen is where /healthz, /readyz and /metrics are served (empty: nowhere).
	Listen    string
	Retention retention.Config
	// CleanEvery is the time between retention passes.
	CleanEvery time.Duration
}

// RegisterFlags adds the reconciler's flags to fs.
func (o *Reconciler) RegisterFlags(fs *pflag.FlagSet) {
	o.Common.RegisterDB(fs)
	o.Common.RegisterBroker(fs)
	def := reconcile.Config{}.WithDefaults()
	fs.IntVar(&o.Config.Batch, "batch", def.Batch, "rows per repair statement")
	fs.DurationVar(&o.Config.Overdue, "overdue", def.Overdue,
		"republish an enqueued or retrying reminder no worker started for this long; keep above normal queue age")
	fs.DurationVar(&o.Config.Lease, "lease", def.Lease, "lease held while republishing")
	fs.DurationVar(&o.Every, "every", reconcile.DefaultEvery, "time between passes")
	fs.BoolVar(&o.Once, "once", false, "run one pass and exit")
	fs.StringVar(&o.Listen, "listen", DefaultListen, "address for /healthz, /readyz and /metrics (empty: none)")
	fs.DurationVar(&o.CleanEvery, "retention-every", reconcile.DefaultCleanEvery, "time between retention passes")
	retention.RegisterFlags(fs, &o.Retention)
}

// Run runs repair passes (and, now and then, a retention pass) until ctx
// ends, serving the table's gauges (metrics.DBCollector) and the
// dispatcher's recorded runs (metrics.DispatchRunCollector) with the probes;
// with Once, it runs one repair pass and returns.
func (o *Reconciler) Run(ctx context.Context, env Env) error {
	if err := o.Retention.Validate(); err != nil {
		return err
	}
	p, err := startPublishing(ctx, &o.Common, "reconciler", reconcilerTimeouts, env)
	if err != nil {
		return err
	}
	defer p.close()
	depths := &broker.DeadLetterDepths{URL: o.Common.AMQPURL, Topology: o.Common.Topology()}
	defer depths.Close()
	queues := &broker.WorkQueues{URL: o.Common.AMQPURL, Topology: o.Common.Topology()}
	defer queues.Close()
	env.Registry.MustRegister(&metrics.DBCollector{DB: p.pool, Clock: env.Clock, DLQDepth: depths.Depths})
	// The dispatcher's metrics, from what its runs recorded: counted from
	// the newest run now, so a scrape sees every run after the start.
	runs := &metrics.DispatchRunCollector{DB: p.pool, Channels: o.Common.Topology().WithDefaults().Channels}
	if err := runs.Start(ctx); err != nil {
		env.Log.Warn().Err(err).Msg("reading the dispatcher's runs; the first scrape tries again")
	}
	env.Registry.MustRegister(runs)
	r := &reconcile.Reconciler{
		Enqueuer:   p.enqueuer,
		Config:     o.Config,
		Log:        env.Log,
		Cleaner:    retention.New(p.pool, o.Retention, env.Clock),
		CleanEvery: o.CleanEvery,
		Queues:     queues.States,
	}
	if o.Once {
		sum, err := r.Pass(ctx)
		r.LogSummary(sum, err)
		r.Record(sum, err, env.Clock.Now())
		return err
	}
	if err := probe.Serve(ctx, o.Listen, env.Registry, r.Ready(o.Every), env.Log); err != nil {
		return err
	}
	return r.Loop(ctx, o.Every)
}
