package fleet

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/probe"
)

// Planner is what the planner binary's flags fill in: a Deployment that
// consumes planning commands, or, with Nudge, the planner's own CronJob that
// publishes one command per campaign still planning and exits.
type Planner struct {
	Common config.Common
	// Nudge publishes one planning command per campaign still planning, and returns.
	Nudge bool
	// Listen is where /healthz, /readyz and /metrics are served (empty: nowhere).
	Listen string
	// Retry is the wait before consuming again after a lost connection.
	Retry time.Duration
	// SliceSize is the slice of campaigns that set none.
	SliceSize int
	// NudgeEvery, when set, makes a consuming planner nudge too, at start
	// and then every NudgeEvery: where no CronJob does (docker compose, one
	// host). Several planners nudging only add duplicates the fence drops.
	NudgeEvery time.Duration
}

// RegisterFlags adds the planner's flags to fs.
func (o *Planner) RegisterFlags(fs *pflag.FlagSet) {
	o.Common.RegisterDB(fs)
	o.Common.RegisterBroker(fs)
	fs.BoolVar(&o.Nudge, "nudge", false,
		"publish one planning command per campaign still planning and exit (the planner's CronJob)")
	fs.StringVar(&o.Listen, "listen", DefaultListen, "address for /healthz, /readyz and /metrics (empty: none)")
	fs.DurationVar(&o.Retry, "reconnect-after", 2*time.Second, "wait before consuming again after the broker connection is lost")
	fs.IntVar(&o.SliceSize, "slice-size", campaign.DefaultSliceSize, fmt.Sprintf(
		"audience rows per slice of a campaign that sets none, %d-%d", campaign.MinSliceSize, campaign.MaxSliceSize))
	fs.DurationVar(&o.NudgeEvery, "nudge-every", 0,
		"while consuming, also publish one planning command per campaign still planning at start and every this long, where no CronJob does (docker compose; 0: never)")
}

// Run checks the planning queue exists, then nudges once (Nudge) or
// consumes planning commands until ctx ends.
func (o *Planner) Run(ctx context.Context, env Env) error {
	if err := campaign.CheckSliceSize(o.SliceSize); err != nil {
		return fmt.Errorf("--slice-size: %w", err)
	}
	if o.Nudge && o.NudgeEvery != 0 {
		return fmt.Errorf("--nudge-every is for a consuming planner; --nudge publishes once and exits")
	}
	if o.NudgeEvery < 0 {
		return fmt.Errorf("--nudge-every %s: want a positive duration, or 0 for never", o.NudgeEvery)
	}
	keys, err := o.Common.Keys()
	if err != nil {
		return err
	}
	if !keys.CanSeal(campaign.Channel) {
		return fmt.Errorf("--signing-keys: the active key has no key for channel %q (give KID@%s:HEX, nudgectl keys derive)",
			campaign.Channel, campaign.Channel)
	}
	pool, err := o.Common.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	actor := config.Actor("planner")
	topo := campaign.Topology(o.Common.QueuePrefix)
	uses := broker.Uses{Exchanges: []string{topo.WorkExchange()}, Queues: []string{topo.Queue(campaign.Channel)}}
	if err := topo.PrepareAt(o.Common.AMQPURL, actor, o.Common.DeclareTopology, uses); err != nil {
		return fmt.Errorf("preparing the planning queue: %w", err)
	}
	pub := broker.NewPublisher(o.Common.AMQPURL, topo, actor)
	pub.Timeout = o.Common.PublishTimeout
	defer pub.Close()
	if o.Nudge {
		n, err := campaign.Nudge(ctx, pool, pub, topo, keys, env.Clock.Now())
		env.Log.Info().Int("campaigns", n).Err(err).Msg("planning commands published")
		return err
	}
	p := &campaign.Planner{Pool: pool, Keys: keys, Publisher: pub, Topology: topo, Clock: env.Clock,
		Name: actor, Log: env.Log, SliceSize: o.SliceSize, Metrics: metrics.NewPlanner(env.Registry)}
	env.Registry.MustRegister(&metrics.PlanningCollector{DB: pool, Clock: env.Clock})
	var consuming atomic.Bool
	if err := probe.Serve(ctx, o.Listen, env.Registry, consuming.Load, env.Log); err != nil {
		return err
	}
	if o.NudgeEvery > 0 {
		var wg sync.WaitGroup
		defer wg.Wait() // before the pool and the publisher close
		wg.Go(func() {
			for {
				n, err := campaign.Nudge(ctx, pool, pub, topo, keys, env.Clock.Now())
				if err != nil && ctx.Err() == nil {
					env.Log.Warn().Err(err).Msg("nudging campaigns")
				} else if n > 0 {
					env.Log.Debug().Int("campaigns", n).Msg("planning commands published")
				}
				if clock.Sleep(ctx, env.Clock, o.NudgeEvery) != nil {
					return
				}
			}
		})
	}
	for {
		consuming.Store(true)
		err := p.Consume(ctx, o.Common.AMQPURL)
		consuming.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		env.Log.Warn().Err(err).Dur("after", o.Retry).Msg("planner consuming again")
		if clock.Sleep(ctx, env.Clock, o.Retry) != nil {
			return nil // stopped on purpose while waiting
		}
	}
}
