// Command sms-worker consumes the SMS queue and sends each reminder through
// the SMS provider's HTTP API: the generic one (with the reminder's
// idempotency key) or Twilio's (--sms-api=twilio), or through several in
// order with failover shared by the fleet (--sms-providers twilio,generic).
package main

import (
	"context"
	"fmt"
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/fleet"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func main() {
	config.GCDefaults(config.WorkerGCPercent, config.WorkerMemoryLimit)
	var (
		o         = fleet.Worker{Name: "sms-worker", Config: worker.Config{Channel: reminder.SMS}}
		smsFlags  sms.Flags
		templates string
		profile   string
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
			stopProfile, err := startCPUProfile(profile)
			if err != nil {
				return err
			}
			defer stopProfile()
			ctx, stop := config.SignalContext()
			defer stop()
			env := fleet.Env{Log: log, Registry: probe.NewRegistry(), Clock: clock.Real{}}
			return o.Run(ctx, env, func() (provider.Sender, func(), error) {
				tmpl, err := sms.LoadTemplates(templates)
				if err != nil {
					return nil, nil, fmt.Errorf("--templates: %w", err)
				}
				for _, api := range smsFlags.APIs() {
					if err := config.CheckSMSURL(smsFlags.URL(api), o.Common.AllowInsecureTLS); err != nil {
						return nil, nil, fmt.Errorf("the %s provider's URL: %w", api, err)
					}
				}
				sender, err := smsFlags.Sender(tmpl, o.Config.SendTimeout)
				if err != nil {
					return nil, nil, err
				}
				return sender, func() {}, nil
			})
		},
	}
	o.Serve = func(ctx context.Context, st *store.Store, env fleet.Env) error {
		if smsFlags.CallbackListen == "" {
			return nil
		}
		cb, err := smsFlags.Callbacks(st, env.Clock, env.Log)
		if err != nil {
			return err
		}
		return sms.ServeCallbacks(ctx, smsFlags.CallbackListen, cb, env.Log)
	}
	f := cmd.Flags()
	o.RegisterFlags(f)
	smsFlags.Register(f)
	f.StringVar(&templates, "templates", "", "directory of NAME.sms.tmpl overriding the built-in templates")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the whole run to this file (for benchmarks)")
	_ = f.MarkHidden("cpuprofile")
	config.Execute(cmd)
}
