// Command dispatcher claims due reminders and publishes them to their
// channel's queue. It runs once and exits (a Kubernetes CronJob), or with
// --every in a loop (docker compose, development).
package main

import (
	"time"
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/metrics"
)

func main() {
	var (
		common      config.Common
		cfg         dispatch.Config
		every       time.Duration
		pushgateway string
	)
	cmd := &cobra.Command{
		Use:   "dispatcher",
		Short: "Claim due reminders in bounded batches and publish them with confirms",
		Long: `dispatcher takes the current time as its cutoff, claims reminders due before it in
batches under a lease and a new fencing token, publishes each reminder's ID to its
channel's queue, and records enqueued only for what the broker confirmed. Reminders
already past their deadline are expired, not published. It stops starting batches
when --budget is near, prints a one-line summary and exits; with --every it repeats.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			reg := prometheus.NewRegistry()
			p, err := dispatch.Start(&common, "dispatcher", metrics.New(reg))
			if err != nil {
				return err
			}
			defer p.Close()
			ctx := p.Ctx
			d := &dispatch.Dispatcher{
				Enqueuer: p.Enqueuer,
				Config:   cfg,
				Log:      p.Log,
				AfterRun: dispatch.Report(p.Pool, p.Enqueuer.Actor, pushgateway, reg, p.Log),
			}
			if every > 0 {
				return d.Loop(ctx, every)
			}
			sum, err := d.RunOnce(ctx)
			d.LogSummary(sum, err)
			d.AfterRun(ctx, sum, err)
			return err
		},
	}
	f := cmd.Flags()
	common.RegisterDB(f)
	common.RegisterBroker(f)
	f.IntVar(&cfg.Batch, "batch", 500, "reminders claimed per batch")
	f.DurationVar(&cfg.Lease, "lease", 2*time.Minute, "how long a claim holds its rows before the reconciler may return them")
	f.DurationVar(&cfg.Budget, "budget", 4*time.Minute, "time budget of one run; keep it below the CronJob's activeDeadlineSeconds")
	f.DurationVar(&every, "every", 0, "run a pass every DURATION instead of once (compose, development)")
	f.StringVar(&pushgateway, "pushgateway", "", "Prometheus Pushgateway address to push each run's summary to (empty: none)")
	config.Execute(cmd)
}
