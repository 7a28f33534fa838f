// Command reconciler repairs from the reminders table what crashes, outages
// and lost messages left behind: it expires what passed its deadline, returns
// expired leases to pending, and republishes overdue or abandoned work.
package main

import (
	"time"
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/internal/retention"
)

func main() {
	var (
		common config.Common
		cfg    reconcile.Config
		every  time.Duration
		once   bool
		listen string
		rcfg   retention.Config
		clean  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "reconciler",
		Short: "Expire late reminders, release dead leases, republish lost work",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := rcfg.Validate(); err != nil {
				return err
			}
			reg := probe.NewRegistry()
			p, err := dispatch.Start(&common, "reconciler", metrics.New(reg))
			if err != nil {
				return err
			}
			defer p.Close()
			ctx, log := p.Ctx, p.Log
			depths := &ops.DLQDepthReader{URL: common.AMQPURL, Topology: common.Topology()}
			defer depths.Close()
			reg.MustRegister(&metrics.DBCollector{DB: p.Pool, Clock: clock.Real{}, DLQDepth: depths.Depths})
			r := &reconcile.Reconciler{
				Enqueuer:   p.Enqueuer,
				Config:     cfg,
				Log:        log,
				Cleaner:    retention.New(p.Pool, rcfg, clock.Real{}),
				CleanEvery: clean,
			}
			if once {
				sum, err := r.Pass(ctx)
				r.LogSummary(sum, err)
				return err
			}
			if err := probe.Serve(ctx, listen, reg, r.Ready(every), log); err != nil {
				return err
			}
			return r.Loop(ctx, every)
		},
	}
	f := cmd.Flags()
	common.RegisterDB(f)
	common.RegisterBroker(f)
	f.IntVar(&cfg.Batch, "batch", 500, "rows per repair statement")
	f.DurationVar(&cfg.Overdue, "overdue", 10*time.Minute,
		"republish an enqueued or retrying reminder no worker started for this long; keep above normal queue age")
	f.DurationVar(&cfg.Lease, "lease", 2*time.Minute, "lease held while republishing")
	f.DurationVar(&every, "every", 10*time.Second, "time between passes")
	f.BoolVar(&once, "once", false, "run one pass and exit")
	f.StringVar(&listen, "listen", ":8080", "address for /healthz, /readyz and /metrics (empty: none)")
	f.DurationVar(&clean, "retention-every", 10*time.Minute, "time between retention passes")
	retention.RegisterFlags(f, &rcfg)
	config.Execute(cmd)
}
