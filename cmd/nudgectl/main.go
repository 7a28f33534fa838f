// Command nudgectl is the operator and intake CLI: it migrates the schema
// and declares the broker topology (the privileged set-up step), schedules
// reminders (one from flags, or a JSON Lines file in bulk), cancels
// them, and shows a reminder's state and event timeline.
package main

import (
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/ctl"
)

func main() {
	config.Execute(ctl.Command())
}
