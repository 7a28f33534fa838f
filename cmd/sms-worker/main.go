// Command sms-worker consumes the SMS queue and sends each reminder through
// the SMS provider's HTTP API with the reminder's idempotency key.
package main

import (
	"fmt"
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/fleet"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func main() {
	var (
		o         = fleet.Worker{Name: "sms-worker", Config: worker.Config{Channel: reminder.SMS}}
		smsCfg    sms.Config
		templates string
	)
	cmd := &cobra.Command{
		Use:   "sms-worker",
		Short: "Send SMS reminders from the SMS queue through the provider's HTTP API",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			log, err := o.Common.Logger(o.Name)
			if err != nil {
				return err
			}
			ctx, stop := config.SignalContext()
			defer stop()
			env := fleet.Env{Log: log, Registry: probe.NewRegistry(), Clock: clock.Real{}}
			return o.Run(ctx, env, func() (provider.Sender, func(), error) {
				tmpl, err := sms.LoadTemplates(templates)
				if err != nil {
					return nil, nil, fmt.Errorf("--templates: %w", err)
				}
				smsCfg.Templates = tmpl
				smsCfg.Timeout = o.Config.SendTimeout
				sender, err := sms.New(smsCfg)
				if err != nil {
					return nil, nil, err
				}
				return sender, func() {}, nil
			})
		},
	}
	f := cmd.Flags()
	o.RegisterFlags(f)
	f.StringVar(&smsCfg.URL, "sms-url", "http://127.0.0.1:9025", "SMS provider base URL; messages are POSTed to URL/v1/messages")
	f.StringVar(&smsCfg.Token, "sms-token", "", "bearer token for the SMS provider")
	f.StringVar(&smsCfg.Sender, "sms-sender", "", "sender id or number (empty: the provider's default)")
	f.StringVar(&templates, "templates", "", "directory of NAME.sms.tmpl overriding the built-in templates")
	config.Execute(cmd)
}
