package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/internal/retention"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/pkg/reminder"
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
	// SMSLookup settles SMS reminders whose deadline passed while an
	// attempt's outcome was unknown by asking the provider (SMS), before
	// expiring them; LookupHold bounds the wait for an answer.
	SMSLookup  bool
	SMS        sms.Flags
	LookupHold time.Duration
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
	fs.BoolVar(&o.SMSLookup, "sms-lookup", true,
		"before expiring an SMS reminder whose attempt's outcome is unknown, ask its provider (configured as sms-worker's: --sms-api, --sms-url, --twilio-*, --sms-providers) and record it delivered when the provider holds the message")
	fs.DurationVar(&o.LookupHold, "lookup-hold", reconcile.DefaultHold,
		"how long past its deadline such a reminder waits for its provider to answer before it expires anyway")
	o.SMS.Register(fs)
}

// lookup builds the providers' lookups (--sms-lookup).
func (o *Reconciler) lookup() (reconcile.Lookup, error) {
	l := reconcile.Lookup{Hold: o.LookupHold}
	if !o.SMSLookup {
		return l, nil
	}
	for _, api := range o.SMS.APIs() {
		if err := config.CheckSMSURL(o.SMS.URL(api), o.Common.AllowInsecureTLS); err != nil {
			return l, fmt.Errorf("--sms-lookup: the %s provider's URL: %w", api, err)
		}
	}
	looker, err := o.SMS.Sender(sms.DefaultTemplates(), reconcile.DefaultLookupTimeout)
	if err != nil {
		return l, fmt.Errorf("--sms-lookup: %w", err)
	}
	l.Lookers = map[reminder.Channel]provider.Looker{reminder.SMS: looker}
	return l, nil
}

// Run runs repair passes (and, now and then, a retention pass) until ctx
// ends, serving the table's gauges (metrics.DBCollector) and the
// dispatcher's recorded runs (metrics.DispatchRunCollector) with the probes;
// with Once, it runs one repair pass and returns.
func (o *Reconciler) Run(ctx context.Context, env Env) error {
	if err := o.Retention.Validate(); err != nil {
		return err
	}
	lookup, err := o.lookup()
	if err != nil {
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
		Lookup:     lookup,
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
