// Command webhook-worker consumes the webhook queue and makes each reminder's
// signed HTTP request to its tenant's application (a cleanup such as
// DELETE https://app.internal/learners/42/drafts/7, or any callback), with the
// reminder's idempotency key. "webhook-worker tenant-secret --tenant T"
// prints the secret tenant T's application verifies with.
package main

import (
	"os"
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/fleet"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/webhook"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func main() {
	config.GCDefaults(config.WorkerGCPercent, config.WorkerMemoryLimit)
	var (
		o  = fleet.Worker{Name: "webhook-worker", Config: worker.Config{Channel: reminder.Webhook}}
		wh fleet.Webhook
	)
	cmd := &cobra.Command{
		Use:   "webhook-worker",
		Short: "Make the webhook queue's signed HTTP requests to the tenants' applications",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			log, err := o.Common.Logger(o.Name)
			if err != nil {
				return err
			}
			ctx, stop := config.SignalContext()
			defer stop()
			env := fleet.Env{Log: log, Registry: probe.NewRegistry(), Clock: clock.Real{}}
			return o.Run(ctx, env, func() (provider.Sender, func(), error) { return wh.NewSender(o.Config.SendTimeout) })
		},
	}
	o.RegisterFlags(cmd.Flags())
	wh.RegisterFlags(cmd.Flags())

	var tenant string
	secret := &cobra.Command{
		Use:   "tenant-secret",
		Short: "Print, per root secret, the secret a tenant's application verifies webhook requests with",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			secrets, err := webhook.ParseSecrets(wh.Secrets)
			if err != nil {
				return err
			}
			return webhook.WriteTenantSecrets(os.Stdout, secrets, tenant)
		},
	}
	wh.TenantSecretFlags(secret.Flags())
	secret.Flags().StringVar(&tenant, "tenant", "", "the tenant")
	config.CommandLineOnly(secret.Flags(), "tenant")
	cmd.AddCommand(secret)
	config.Execute(cmd)
}
