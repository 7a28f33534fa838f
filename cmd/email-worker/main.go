// Command email-worker consumes the email queue and sends each reminder over
// SMTP, with a Message-ID derived from the reminder's idempotency key.
package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/email"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func main() {
	var (
		common    config.Common
		cfg       = worker.Config{Channel: reminder.Email}
		smtpURL   string
		from      string
		templates string
		listen    string
		limits    string
	)
	cmd := &cobra.Command{
		Use:   "email-worker",
		Short: "Send email reminders from the email queue over SMTP",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := common.Logger("email-worker")
			if err != nil {
				return err
			}
			keys, err := common.Keys()
			if err != nil {
				return err
			}
			smtpCfg, err := email.ParseSMTPURL(smtpURL)
			if err != nil {
				return fmt.Errorf("--smtp-url: %w", err)
			}
			if from != "" {
				smtpCfg.From = from
			}
			tmpl, err := email.LoadTemplates(templates)
			if err != nil {
				return fmt.Errorf("--templates: %w", err)
			}
			sender, err := email.New(smtpCfg, tmpl)
			if err != nil {
				return err
			}
			defer sender.Close()
			ctx, stop := config.SignalContext()
			defer stop()
			pool, err := common.Pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			cfg.Name = config.Actor("email-worker")
			reg := probe.NewRegistry()
			lim, err := ratelimit.Load(limits)
			if err != nil {
				return fmt.Errorf("--limits: %w", err)
			}
			ratelimit.ExportVersion(reg, lim)
			log.Info().Str("version", lim.Version).Str("file", limits).Msg("rate limits active")
			w, err := worker.New(cfg, worker.Deps{Metrics: metrics.New(reg), Limiter: ratelimit.New(pool, lim),
				AMQPURL: common.AMQPURL, Topology: common.Topology(), Store: store.New(pool),
				Sender: sender, Keys: keys, Clock: clock.Real{}, Log: log,
			})
			if err != nil {
				return err
			}
			return w.Serve(ctx, listen, reg)
		},
	}
	f := cmd.Flags()
	common.RegisterDB(f)
	common.RegisterBroker(f)
	worker.RegisterFlags(f, &cfg)
	f.StringVar(&smtpURL, "smtp-url", "smtp://127.0.0.1:1025?tls=none",
		"SMTP relay, smtp[s]://[user:pass@]host:port[?tls=none|starttls|tls&from=...&auth=plain|login|cram-md5]")
	f.StringVar(&from, "smtp-from", "Nudge <reminders@nudge.local>", "From address (overrides from= in --smtp-url)")
	f.StringVar(&templates, "templates", "", "directory of NAME.subject.tmpl, NAME.txt.tmpl, NAME.html.tmpl overriding the built-in templates")
	f.StringVar(&listen, "listen", ":8080", "address for /healthz, /readyz and /metrics (empty: none)")
	f.StringVar(&limits, "limits", "", "fleet-wide rate limits file (JSON, docs/rate-limits.md; empty: none)")
	config.Execute(cmd)
}
