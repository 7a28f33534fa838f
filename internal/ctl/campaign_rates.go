package ctl

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/ratelimit"
)

// campaignRatesCmd is `nudgectl campaign rates`: the budget the web tier's
// nudge_campaign_create admits campaigns with (schema 29), stored from the
// workers' limits file and retry flags, or shown.
func campaignRatesCmd(connect connector) *cobra.Command {
	var (
		limits, by string
		b          campaign.Budget
	)
	cmd := &cobra.Command{
		Use:   "rates",
		Short: "Store (--limits FILE) or show the rates and retry budget the web tier's campaign create is admitted with",
		Long: `rates stores what the web tier's nudge_campaign_create needs to admit a campaign as
nudgectl campaign create does: the sends per second the workers' limits file gives each channel
(per tenant it names, and for every other tenant: the lowest of the channel's account, providers
and tenant allowance), the retry budget of --max-attempts, --backoff-base and --backoff-max (the
workers' flags), and the planner's --slice-size. It replaces what was stored, in one transaction;
run it again whenever the limits file or the workers' retry flags change.

  nudgectl campaign rates --limits /etc/nudge/limits.json --max-attempts 5

--limits '' stores "no limit" for every channel. Without a flag, it shows what is stored. Until
rates are stored, the web tier's campaigns are judged as nudgectl campaign create judges one
without --limits: no delivery budget, and the workers' default retries (15 s).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store := cmd.Flags().Changed("limits")
			if store {
				if b.MaxAttempts < 1 {
					return usage(fmt.Errorf("--max-attempts %d: want at least 1", b.MaxAttempts))
				}
				if err := campaign.CheckSliceSize(b.SliceSize); err != nil {
					return usage(fmt.Errorf("--planner-slice-size: %w", err))
				}
				l, err := ratelimit.Load(limits)
				if err != nil {
					return usage(fmt.Errorf("--limits: %w", err))
				}
				b.Limits, b.LimitsFrom = l, limits
			}
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			if store {
				if _, _, err := campaign.StoreRates(ctx, pool, b, by, time.Now()); err != nil {
					return err
				}
			}
			sb, rates, ok, err := campaign.ReadRates(ctx, pool)
			if err != nil {
				return err
			}
			writeRates(cmd.OutOrStdout(), sb, rates, ok)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&limits, "limits", "", "the workers' rate-limits file ('': no limit on any channel)")
	fs.IntVar(&b.MaxAttempts, "max-attempts", 5, "the workers' --max-attempts, for the retry budget")
	fs.DurationVar(&b.BackoffBase, "backoff-base", time.Second, "the workers' --backoff-base")
	fs.DurationVar(&b.BackoffMax, "backoff-max", time.Hour, "the workers' --backoff-max")
	fs.IntVar(&b.SliceSize, "planner-slice-size", campaign.DefaultSliceSize,
		"the planner's --slice-size, for campaigns that set none")
	fs.StringVar(&by, "actor", "nudgectl", "name recorded as who stored the rates")
	config.CommandLineOnly(fs, "limits")
	return cmd
}

func writeRates(w io.Writer, b campaign.StoredBudget, rates []campaign.StoredRate, ok bool) {
	if !ok {
		fmt.Fprintln(w, "no campaign admission rates stored: the web tier's campaigns get no delivery budget and the "+
			"workers' default retries (nudgectl campaign rates --limits FILE stores them)")
		return
	}
	version := b.LimitsVersion
	if version == "" {
		version = "-"
	}
	fmt.Fprintf(w, "stored %s by %s from %s (version %s)\n", b.StoredAt.UTC().Format(time.RFC3339), b.StoredBy,
		b.LimitsFrom, version)
	fmt.Fprintf(w, "retries: %s (%s)\n", b.Retry, b.RetryFrom)
	fmt.Fprintf(w, "planner slice size: %d\n", b.SliceSize)
	fmt.Fprintf(w, "%-8s %-16s %10s  %s\n", "CHANNEL", "TENANT", "SENDS/S", "FROM")
	for _, r := range rates {
		tenant, rate := r.Tenant, fmt.Sprintf("%g", r.Rate)
		if tenant == campaign.OtherTenants {
			tenant = "(others)"
		}
		if r.Rate == 0 {
			rate = "no limit"
		}
		fmt.Fprintf(w, "%-8s %-16s %10s  %s\n", r.Channel, tenant, rate, r.From)
	}
}
