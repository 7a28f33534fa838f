// Command email-worker consumes the email queue and sends each reminder over
// SMTP, with a Message-ID derived from the reminder's idempotency key.
package main

import (
	"fmt"
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/email"
	"github.com/nudgehq/nudge/internal/fleet"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func main() {
	config.GCDefaults(config.WorkerGCPercent, config.WorkerMemoryLimit)
	var (
		o         = fleet.Worker{Name: "email-worker", Config: worker.Config{Channel: reminder.Email}}
		smtpURL   string
		from      string
		templates string
	)
	cmd := &cobra.Command{
		Use:   "email-worker",
		Short: "Send email reminders from the email queue over SMTP",
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
				smtpCfg, err := email.ParseSMTPURL(smtpURL)
				if err != nil {
					return nil, nil, fmt.Errorf("--smtp-url: %w", err)
				}
				if from != "" {
					smtpCfg.From = from
				}
				tmpl, err := email.LoadTemplates(templates)
				if err != nil {
					return nil, nil, fmt.Errorf("--templates: %w", err)
				}
				sender, err := email.New(smtpCfg, tmpl)
				if err != nil {
					return nil, nil, err
				}
				return sender, func() { _ = sender.Close() }, nil
			})
		},
	}
	f := cmd.Flags()
	o.RegisterFlags(f)
	f.StringVar(&smtpURL, "smtp-url", "smtp://127.0.0.1:1025?tls=none",
		"SMTP relay, smtp[s]://[user:pass@]host:port[?tls=none|starttls|tls&from=...&auth=plain|login|cram-md5]")
	f.StringVar(&from, "smtp-from", "Nudge <reminders@nudge.local>", "From address (overrides from= in --smtp-url)")
	f.StringVar(&templates, "templates", "", "directory of NAME.subject.tmpl, NAME.txt.tmpl, NAME.html.tmpl overriding the built-in templates")
	config.Execute(cmd)
}
