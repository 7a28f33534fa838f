package ctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
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
	var (
		asJSON  bool
		compare int64
	)
	cmd := &cobra.Command{
		Use: "status ID",
		Short: "Show a campaign's progress: planned, remaining, slices done, slice time, checkpoint lag, late slices, " +
			"its reminders by state, and shadow counts beside a real run's (--json: one JSON object)",
		Long: `status shows one campaign's progress. A shadow run's status shows its intended counts per slice
beside those of the latest real campaign over the same tenant, source and slice size (a real run's,
beside the latest such shadow run's), and whether each slice matches; --compare ID names the
campaign to compare with instead.`,
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
			r, err := campaign.GetReportComparedWith(ctx, pool, id, time.Now(), compare)
			if errors.Is(err, campaign.ErrNotComparable) {
				return usage(err)
			}
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
	cmd.Flags().Int64Var(&compare, "compare", 0, "compare with this campaign (a real run for a shadow run, or a "+
		"shadow run for a real one) instead of the latest over the same tenant, source and slice size")
	return cmd
}

// writeReport prints a campaign's report as "name: value" lines, after a
// progress bar when bar is set (a terminal).
func writeReport(w io.Writer, r campaign.Report, bar bool) {
	shadow := ""
	if r.Shadow {
		shadow = ", a shadow run: it creates no reminders"
	}
	fmt.Fprintf(w, "campaign %d %q of tenant %s (source %s, %s): %s%s\n", r.ID, r.Name, r.Tenant, r.Source, r.Channel,
		r.State, shadow)
	if done, total, ok := r.Progress(); bar && ok {
		fmt.Fprintln(w, renderCampaignBar(done, total))
	}
	if r.Shadow {
		fmt.Fprintf(w, "planned: %d (intended)\n", r.Planned)
	} else {
		fmt.Fprintf(w, "planned: %d\n", r.Planned)
	}
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
	if r.SliceMSMedian != nil && r.SliceMSP95 != nil {
		fmt.Fprintf(w, "slice time: median %s, p95 %s (%d slices measured)\n", ms(*r.SliceMSMedian), ms(*r.SliceMSP95),
			r.SlicesMeasured)
	} else {
		fmt.Fprintln(w, "slice time: - (no slice measured yet)")
	}
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
	if c := r.Comparison; c != nil {
		writeComparison(w, *c)
	}
}

// maxSlicesPrinted bounds the slices status prints; past it, only the
// slices that differ (--json lists campaign.MaxSlicesListed, nudgectl
// campaign compare every one).
const maxSlicesPrinted = 20

// writeComparison prints a shadow run beside a real run: the totals, whether
// they match, and the slices (all of a short campaign, else those that differ).
func writeComparison(w io.Writer, c campaign.Comparison) {
	how := map[string]string{"named": "named with --compare", "latest": "the latest over the same tenant, source and slice size"}
	if c.RealID == nil {
		fmt.Fprintf(w, "shadow counts: %d slices, %d rows read, %d intended reminders, %d bad rows; no real run to compare with "+
			"(none over the same tenant, source and slice size)\n", c.Slices, c.ShadowRows, c.ShadowIntents, c.ShadowBad)
	} else {
		verdict := "every slice matches"
		if !c.Same {
			verdict = fmt.Sprintf("%d of them differ", c.SlicesDiffer)
		}
		fmt.Fprintf(w, "shadow %d vs real %d (%s): %d slices, %s; intents %d vs %d, rows %d vs %d, bad rows %d vs %d\n",
			c.ShadowID, *c.RealID, how[c.Chosen], c.Slices, verdict, c.ShadowIntents, c.RealIntents, c.ShadowRows, c.RealRows,
			c.ShadowBad, c.RealBad)
	}
	shown := c.PerSlice
	hint := "--json lists the first " + fmt.Sprint(campaign.MaxSlicesListed)
	switch {
	case c.Slices <= maxSlicesPrinted:
	case c.RealID != nil:
		// Only the slices that differ: those are what to look at.
		shown = slices.DeleteFunc(slices.Clone(shown), func(s campaign.SliceComparison) bool { return s.Same })
		shown = shown[:min(len(shown), maxSlicesPrinted)]
		hint = fmt.Sprintf("only slices that differ are printed; nudgectl campaign compare %d %d prints all", c.ShadowID, *c.RealID)
	default:
		shown = shown[:min(len(shown), maxSlicesPrinted)]
	}
	if len(shown) > 0 {
		writeSliceComparisons(w, shown, c.RealID != nil)
	}
	if n := c.Slices - int64(len(shown)); n > 0 {
		fmt.Fprintf(w, "... %d more slices not printed (%s)\n", n, hint)
	}
}

// writeSliceComparisons prints slices as a table: a shadow run's rows read,
// intents and bad rows beside a real run's, and whether they match (only
// when there is a real run).
func writeSliceComparisons(w io.Writer, cs []campaign.SliceComparison, marks bool) (differ int) {
	fmt.Fprintf(w, "%-6s %-22s %-22s %s\n", "SLICE", "SHADOW rows/ok/bad", "REAL rows/ok/bad", "")
	for _, c := range cs {
		mark := ""
		if marks {
			mark = "same"
			if !c.Same {
				mark, differ = "DIFFERS", differ+1
			}
		}
		fmt.Fprintf(w, "%-6d %-22s %-22s %s\n", c.Slice, counts(c.ShadowRows, c.ShadowIntents, c.ShadowBad),
			counts(c.RealRows, c.RealIntents, c.RealBad), mark)
	}
	return differ
}

// ms prints milliseconds, to the millisecond.
func ms(v float64) string { return fmt.Sprintf("%.0f ms", v) }

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
