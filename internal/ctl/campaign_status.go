package ctl

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// isTerminal says whether w is a terminal: the status draws its progress bar
// only there. A variable, so that a test can stand in for a terminal.
var isTerminal = isTerminalFile

func isTerminalFile(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// campaignStatusCmd is `nudgectl campaign status ID`: one campaign's
// progress, as text (with a progress bar on a terminal) or, with --json, as
// one JSON object of stable field names (campaign.Report, docs/operations.md).
func campaignStatusCmd(connect connector) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use: "status ID",
		Short: "Show a campaign's progress: planned, remaining, slices done, checkpoint lag, late slices and " +
			"its reminders by state (--json: one JSON object)",
		Args: cobra.ExactArgs(1),
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
			r, err := campaign.GetReport(ctx, pool, id, time.Now())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			writeReport(out, r, isTerminal(out))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object (stable field names) instead of text")
	return cmd
}

// writeReport prints a campaign's report as "name: value" lines, after a
// progress bar when bar is set (a terminal).
func writeReport(w io.Writer, r campaign.Report, bar bool) {
	fmt.Fprintf(w, "campaign %d %q of tenant %s (source %s, %s): %s\n", r.ID, r.Name, r.Tenant, r.Source, r.Channel, r.State)
	if done, total, ok := r.Progress(); bar && ok {
		fmt.Fprintln(w, renderCampaignBar(done, total))
	}
	fmt.Fprintf(w, "planned: %d\n", r.Planned)
	fmt.Fprintf(w, "bad rows: %d\n", r.BadRows)
	switch {
	case r.Remaining != nil && r.RemainingEstimated:
		fmt.Fprintf(w, "remaining: ~%d (estimated from the source's row count: %s)\n", *r.Remaining, r.RemainingError)
	case r.Remaining != nil:
		fmt.Fprintf(w, "remaining: %d\n", *r.Remaining)
	default:
		fmt.Fprintf(w, "remaining: unknown (%s)\n", r.RemainingError)
	}
	size := "the planner's"
	if r.SliceSize != nil {
		size = fmt.Sprint(*r.SliceSize)
	}
	fmt.Fprintf(w, "slices done: %d (slice size %s, lease %s)\n", r.SlicesDone, size,
		time.Duration(r.LeaseSeconds*float64(time.Second)))
	lag := "-"
	if r.CheckpointLagSeconds != nil {
		lag = time.Duration(*r.CheckpointLagSeconds * float64(time.Second)).Round(time.Second).String()
	}
	fmt.Fprintf(w, "checkpoint lag: %s\n", lag)
	unplanned := "-"
	if r.Unplanned != nil {
		unplanned = fmt.Sprint(*r.Unplanned)
	}
	fmt.Fprintf(w, "late slices: %d (unplanned rows: %s)\n", r.LateSlices, unplanned)
	fmt.Fprintf(w, "deadline: %s\n", r.Deadline.UTC().Format(time.RFC3339))
	parts := make([]string, 0, len(reminder.States))
	for _, st := range reminder.States {
		parts = append(parts, fmt.Sprintf("%s %d", st, r.Deliveries[st]))
	}
	fmt.Fprintf(w, "deliveries: %s\n", strings.Join(parts, ", "))
}

// renderCampaignBar is the audience read so far as a bar of 40 cells.
func renderCampaignBar(done, total int64) string {
	const width = 40
	filled, pct := 0, 100.0
	if total > 0 {
		filled = int(min(width, done*width/total))
		pct = float64(done) * 100 / float64(total)
	}
	return fmt.Sprintf("[%s%s] %5.1f%% %d/%d rows", strings.Repeat("#", filled), strings.Repeat(".", width-filled), pct, done, total)
}
