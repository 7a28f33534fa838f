// Command sms-worker consumes the SMS queue and sends each reminder through
// the SMS provider's HTTP API with the reminder's idempotency key.
package main

import (
	"fmt"
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func main() {
	var (
		p         = worker.Process{Config: worker.Config{Channel: reminder.SMS}}
		smsCfg    sms.Config
		templates string
	)
	cmd := &cobra.Command{
		Use:   "sms-worker",
		Short: "Send SMS reminders from the SMS queue through the provider's HTTP API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return p.Run("sms-worker", func() (provider.Sender, func(), error) {
				tmpl, err := sms.LoadTemplates(templates)
				if err != nil {
					return nil, nil, fmt.Errorf("--templates: %w", err)
				}
				smsCfg.Templates = tmpl
				smsCfg.Timeout = p.Config.SendTimeout
				sender, err := sms.New(smsCfg)
				if err != nil {
					return nil, nil, err
				}
				return sender, func() {}, nil
			})
		},
	}
	f := cmd.Flags()
	p.RegisterFlags(f)
	f.StringVar(&smsCfg.URL, "sms-url", "http://127.0.0.1:9025", "SMS provider base URL; messages are POSTed to URL/v1/messages")
	f.StringVar(&smsCfg.Token, "sms-token", "", "bearer token for the SMS provider")
	f.StringVar(&smsCfg.Sender, "sms-sender", "", "sender id or number (empty: the provider's default)")
	f.StringVar(&templates, "templates", "", "directory of NAME.sms.tmpl overriding the built-in templates")
	config.Execute(cmd)
}
