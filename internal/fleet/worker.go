package fleet

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/worker"
)

// Worker is what a worker binary's flags fill in: the connections, the
// worker's tuning, where to serve probes and the limits file. Both worker
// binaries run through it, so they differ only in their provider adapter.
type Worker struct {
	// Name names the process in logs and in the event trail ("email-worker").
	Name   string
	Common config.Common
	Config worker.Config
	// Listen is where /healthz, /readyz and /metrics are served (empty: nowhere).
	Listen string
	// Limits is the fleet-wide rate limits file (empty: none).
	Limits string
	// Serve, when set, starts what the binary serves beside the worker
	// (sms-worker: Twilio's status callbacks) once the database is open;
	// it must return once started, and stop when ctx ends.
	Serve func(ctx context.Context, st *store.Store, env Env) error
}

// sharedSender is a sender whose choice of provider the fleet shares
// through PostgreSQL (sms.Failover): Run gives it the store before the
// worker starts, and the rate limiter takes the limits of its Current
// provider.
type sharedSender interface {
	Share(s sms.Shared, clk clock.Clock, log zerolog.Logger, reg prometheus.Registerer)
	Current() string
}

// RegisterFlags adds every flag a worker binary shares to fs.
func (o *Worker) RegisterFlags(fs *pflag.FlagSet) {
	o.Common.RegisterDB(fs)
	o.Common.RegisterBroker(fs)
	c, def := &o.Config, o.Config.WithDefaults()
	fs.IntVar(&c.Concurrency, "concurrency", def.Concurrency, "batches processed at once")
	fs.IntVar(&c.Batch, "batch", def.Batch, "deliveries processed together (one read, one claim, one outcome write)")
	fs.DurationVar(&c.BatchWait, "batch-wait", def.BatchWait, "how long a partial batch waits for more deliveries")
	fs.IntVar(&c.Prefetch, "prefetch", 0, "reminders the broker may send ahead, unacked; an envelope counts its entries (0: concurrency × batch × 2)")
	fs.DurationVar(&c.SendTimeout, "send-timeout", def.SendTimeout, "bound on one provider call (the reminder's deadline bounds it too)")
	fs.DurationVar(&c.DeadlineMargin, "deadline-margin", 0,
		"a send is not started when its deadline is this close; size it above the provider's latency "+
			"(0: automatic, twice the measured p99 of provider calls, 100ms to send-timeout, 1s before the first call)")
	fs.DurationVar(&c.SendLease, "send-lease", 0,
		"how long a claimed attempt is protected before the reconciler may retry it (0: send-timeout + 30s)")
	fs.IntVar(&c.MaxAttempts, "max-attempts", def.MaxAttempts, "send attempts per reminder before it fails")
	fs.DurationVar(&c.BackoffBase, "backoff-base", def.BackoffBase,
		"first retry delay (doubles per attempt, with jitter, rounded up to a retry tier)")
	fs.DurationVar(&c.BackoffMax, "backoff-max", def.BackoffMax, "longest retry delay")
	fs.DurationVar(&c.Grace, "grace", def.Grace,
		"on SIGTERM, time to finish and ack in-flight work; keep below terminationGracePeriodSeconds")
	fs.Float64Var(&c.Rate, "rate", 0, "sends per second in this process (0: unlimited)")
	fs.IntVar(&c.Burst, "burst", 0, "rate limiter burst (0: the rate rounded up)")
	fs.StringVar(&o.Listen, "listen", DefaultListen, "address for /healthz, /readyz and /metrics (empty: none)")
	fs.StringVar(&o.Limits, "limits", "", "fleet-wide rate limits file (JSON, docs/rate-limits.md; empty: none)")
}

// Run connects, loads the limits, serves the probes and consumes until ctx
// ends, then drains. newSender builds the provider adapter once the
// configuration is known to be valid; kill -HUP reads the limits file again.
func (o *Worker) Run(ctx context.Context, env Env, newSender func() (provider.Sender, func(), error)) error {
	keys, err := o.Common.Keys()
	if err != nil {
		return err
	}
	if keys.Root() {
		// Allowed (the upgrade to channel keys starts with the root keys,
		// which also verify messages signed before it), but a worker holding
		// them can sign every channel's work.
		env.Log.Warn().Str("channel", string(o.Config.Channel)).
			Msg("this worker holds the root signing keys; give it only its channel's (nudgectl keys derive, docs/deploy.md)")
	}
	lim, err := ratelimit.Load(o.Limits)
	if err != nil {
		return fmt.Errorf("--limits: %w", err)
	}
	sender, closeSender, err := newSender()
	if err != nil {
		return err
	}
	defer closeSender()
	pool, err := o.Common.PoolWith(ctx, workerTimeouts)
	if err != nil {
		return err
	}
	defer pool.Close()
	version := ratelimit.ExportVersion(env.Registry, lim)
	env.Log.Info().Str("version", lim.Version).Str("file", o.Limits).Msg("rate limits active")
	limiter := ratelimit.New(pool, lim)
	if o.Limits != "" {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go ratelimit.Reload(ctx, hup, o.Limits, limiter, version, env.Log)
	}
	cfg := o.Config
	cfg.Name = config.Actor(o.Name)
	st := store.New(pool).ForChannel(o.Config.Channel)
	if s, ok := sender.(sharedSender); ok {
		s.Share(st, env.Clock, env.Log, env.Registry)
		limiter.UseProviders(func(string) string { return s.Current() })
	}
	w, err := worker.New(cfg, worker.Deps{
		AMQPURL: o.Common.AMQPURL, Topology: o.Common.Topology(), Store: st, Sender: sender,
		Keys: keys, Clock: env.Clock, Log: env.Log, Metrics: metrics.NewFor(env.Registry, metrics.Worker, string(o.Config.Channel)), Limiter: limiter,
		DeclareTopology: o.Common.DeclareTopology, PublishTimeout: o.Common.PublishTimeout,
	})
	if err != nil {
		return err
	}
	if err := probe.Serve(ctx, o.Listen, env.Registry, w.Ready, env.Log); err != nil {
		return err
	}
	if o.Serve != nil {
		if err := o.Serve(ctx, st, env); err != nil {
			return err
		}
	}
	err = w.Run(ctx)
	c := w.Counts()
	env.Log.Info().Int64("delivered", c.Delivered).Int64("retried", c.Retried).Int64("failed", c.Failed).
		Int64("expired", c.Expired).Int64("duplicates", c.Duplicates).Int64("superseded", c.Superseded).
		Int64("dead_lettered", c.DeadLettered).Int64("stale", c.Stale).Int64("quarantined", c.Quarantined).
		Int64("deferred", c.Deferred).Int64("slots_missed", c.SlotsMissed).
		Int64("prefetch_windows", c.Windows).
		Msg("worker stopped")
	return err
}
