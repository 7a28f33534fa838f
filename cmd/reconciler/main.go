// Command reconciler repairs from the reminders table what crashes, outages
// and lost messages left behind: it expires what passed its deadline, returns
// expired leases to pending, and republishes overdue or abandoned work.
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
	var o fleet.Reconciler
	cmd := &cobra.Command{
		Use:   "reconciler",
		Short: "Expire late reminders, release dead leases, republish lost work",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			log, err := o.Common.Logger("reconciler")
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
