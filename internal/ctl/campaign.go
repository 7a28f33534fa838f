package ctl

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/campaign"
)

// campaignCmd is `nudgectl campaign`: campaigns planned in slices through
// the planning queue (internal/campaign). The same operations are SQL
// functions for the web tier (nudge_campaign_create, nudge_campaign_set).
func campaignCmd(connect connector) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "campaign",
		Short: "Create, inspect, pause, resume and cancel campaigns planned in slices from an audience source",
	}
	cmd.AddCommand(campaignCreateCmd(connect), campaignStatusCmd(connect), campaignListCmd(connect))
	cmd.AddCommand(campaignStageCmd(connect), campaignCohortCmd(connect), campaignCompareCmd(connect)) // campaign_stage.go
	cmd.AddCommand(campaignRatesCmd(connect))                                                          // campaign_rates.go
	for _, a := range []campaign.Action{campaign.Pause, campaign.Resume, campaign.Cancel} {
		cmd.AddCommand(campaignSetCmd(connect, a))
	}
	return cmd
}

func campaignListCmd(connect connector) *cobra.Command {
	var (
		tenant string
		limit  int
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List campaigns and their progress",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			ss, err := campaign.List(ctx, pool, tenant, limit)
			if err != nil {
				return err
			}
			writeCampaigns(cmd.OutOrStdout(), time.Now(), ss...)
			return nil
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant's campaigns")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many")
	return cmd
}

func campaignSetCmd(connect connector, a campaign.Action) *cobra.Command {
	var tenant string
	cmd := &cobra.Command{
		Use:   string(a) + " ID",
		Short: fmt.Sprintf("%s a campaign of --tenant", a),
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := campaignID(args[0])
			if err != nil {
				return err
			}
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			st, err := campaign.Set(ctx, pool, tenant, id, a)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "campaign %d is %s\n", id, st)
			return nil
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant of the campaign (required)")
	_ = cmd.MarkFlagRequired("tenant")
	return cmd
}

func campaignID(arg string) (int64, error) {
	id, err := strconv.ParseInt(arg, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("campaign ID %q: %w", arg, err)
	}
	return id, nil
}

// writeCampaigns prints one line per campaign; checkpoint lag is the time
// since its last committed slice.
func writeCampaigns(w io.Writer, now time.Time, ss ...campaign.Status) {
	fmt.Fprintf(w, "%-6s %-12s %-24s %-9s %9s %6s %7s %10s %s\n",
		"ID", "TENANT", "NAME", "STATE", "PLANNED", "BAD", "SLICES", "UNPLANNED", "CHECKPOINT LAG")
	for _, s := range ss {
		unplanned, lag := "-", "-"
		if s.Unplanned != nil {
			unplanned = strconv.FormatInt(*s.Unplanned, 10)
		}
		if s.LastCheckpoint != nil {
			lag = now.Sub(*s.LastCheckpoint).Round(time.Second).String()
		}
		fmt.Fprintf(w, "%-6d %-12s %-24s %-9s %9d %6d %7d %10s %s\n",
			s.ID, s.Tenant, s.Name, s.State, s.Planned, s.Bad, s.Slices, unplanned, lag)
	}
}
