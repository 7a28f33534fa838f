// Command sms-worker consumes the SMS queue and sends each reminder through
// the SMS provider's HTTP API with the reminder's idempotency key.
package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func main() {
	var (
		common    config.Common
		cfg       = worker.Config{Channel: reminder.SMS}
		smsCfg    sms.Config
		templates string
		listen    string
		limits    string
	)
	cmd := &cobra.Command{
		Use:   "sms-worker",
		Short: "Send SMS reminders from the SMS queue through the provider's HTTP API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := common.Logger("sms-worker")
			if err != nil {
				return err
			}
			keys, err := common.Keys()
			if err != nil {
				return err
			}
			tmpl, err := sms.LoadTemplates(templates)
			if err != nil {
				return fmt.Errorf("--templates: %w", err)
			}
			smsCfg.Templates = tmpl
			smsCfg.Timeout = cfg.SendTimeout
			sender, err := sms.New(smsCfg)
			if err != nil {
				return err
			}
			ctx, stop := config.SignalContext()
			defer stop()
			pool, err := common.Pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			cfg.Name = config.Actor("sms-worker")
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
	f.StringVar(&smsCfg.URL, "sms-url", "http://127.0.0.1:9025", "SMS provider base URL; messages are POSTed to URL/v1/messages")
	f.StringVar(&smsCfg.Token, "sms-token", "", "bearer token for the SMS provider")
	f.StringVar(&smsCfg.Sender, "sms-sender", "", "sender id or number (empty: the provider's default)")
	f.StringVar(&templates, "templates", "", "directory of NAME.sms.tmpl overriding the built-in templates")
	f.StringVar(&listen, "listen", ":8080", "address for /healthz, /readyz and /metrics (empty: none)")
	f.StringVar(&limits, "limits", "", "fleet-wide rate limits file (JSON, docs/rate-limits.md; empty: none)")
	config.Execute(cmd)
}
