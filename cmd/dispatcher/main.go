// Command dispatcher claims due reminders and publishes them to their
// channel's queue. It runs once and exits (a Kubernetes CronJob), or with
// --every in a loop (docker compose, development).
package main

import (
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/fleet"
)

func main() {
	var o fleet.Dispatcher
	cmd := &cobra.Command{
		Use:   "dispatcher",
		Short: "Claim due reminders in bounded batches and publish them with confirms",
		Long: `dispatcher takes the current time as its cutoff and claims reminders due before it
in batches: a claim moves its rows straight to enqueued under a dispatch lease
(--lease) and a new fencing token. It publishes each reminder's ID to its channel's
queue with publisher confirms and records one publish confirmation per batch for
what the broker confirmed; what was not confirmed goes back to pending at once, and
the rows of a run killed before recording return to pending when their lease
expires (the reconciler). Reminders already past their deadline are expired, not
published. It stops starting batches when --budget is near, prints a one-line
summary and exits; with --every it repeats.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			log, err := o.Common.Logger("dispatcher")
			if err != nil {
				return err
			}
			ctx, stop := config.SignalContext()
			defer stop()
			// A CronJob's process is gone before a scrape: its metrics are pushed, without Go's own.
			return o.Run(ctx, fleet.Env{Log: log, Registry: prometheus.NewRegistry(), Clock: clock.Real{}})
		},
	}
	o.RegisterFlags(cmd.Flags())
	config.Execute(cmd)
}
