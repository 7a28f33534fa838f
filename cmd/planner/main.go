// Command planner plans campaigns a slice at a time: as a Deployment it
// consumes signed planning commands from the planning queue, writes one
// slice of reminders and its checkpoint per command, and publishes the next;
// with --nudge (its CronJob) it publishes one command per campaign still
// planning and exits (internal/campaign, docs/design.md).
package main

import (
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/fleet"
	"github.com/nudgehq/nudge/internal/probe"
)

func main() {
	var o fleet.Planner
	cmd := &cobra.Command{
		Use:   "planner",
		Short: "Plan campaigns in checkpointed slices from the planning queue (--nudge: publish their commands, the CronJob)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			log, err := o.Common.Logger("planner")
			if err != nil {
				return err
			}
			ctx, stop := config.SignalContext()
			defer stop()
			return o.Run(ctx, fleet.Env{Log: log, Registry: probe.NewRegistry(), Clock: clock.Real{}})
		},
	}
	o.RegisterFlags(cmd.Flags())
	config.Execute(cmd)
}
