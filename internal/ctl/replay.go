package ctl

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// parseWhen reads a time flag: RFC 3339, "now", or "now-2h" / "now+30m".
func parseWhen(flag, s string, now time.Time) (*time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	if rest, ok := strings.CutPrefix(s, "now"); ok {
		if rest == "" {
			return &now, nil
		}
		d, err := time.ParseDuration(rest)
		if err == nil && (rest[0] == '-' || rest[0] == '+') {
			t := now.Add(d)
			return &t, nil
		}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, fmt.Errorf("--%s %q: want an RFC 3339 time, now, or now-DURATION (now-2h)", flag, s)
	}
	return &t, nil
}

func replayCmd(connect connector) *cobra.Command {
	var (
		df                        decisionFlags
		ids                       []int64
		from, to, channel, tenant string
		states                    []string
		stuckFor                  time.Duration
		batch                     int
		asJSON                    bool
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Return reminders of a due-time window and/or chosen IDs to work, under a new fence (try --dry-run first)",
		Long: `replay moves the selected reminders back to pending under a new fence, with an event naming
--actor and --reason; the dispatcher publishes them on its next run, and any message still
queued for them is superseded (workers discard it).

Select with --id and/or a due-time window (--from inclusive, --to exclusive; RFC 3339, now, or
now-2h), narrowed by --channel, --tenant and --state. The default states are failed and
quarantined, plus leased, enqueued and retrying reminders stuck for --stuck-for (a lease expired
that long ago, enqueued that long ago, a retry that much overdue). Delivered, canceled, expired
and sending reminders are never replayed; pending ones already wait and are left alone. So a
second run replays nothing the first one did.

A reminder whose deadline has passed or is less than --margin away is refused, and so is one
whose payload the retention pass removed; the output says how many and which.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := df.decision(true)
			if err != nil {
				return err
			}
			now := time.Now()
			sel := ops.ReplaySelection{IDs: ids, Tenant: tenant, StuckFor: stuckFor, Batch: batch}
			if sel.DueFrom, err = parseWhen("from", from, now); err != nil {
				return err
			}
			if sel.DueTo, err = parseWhen("to", to, now); err != nil {
				return err
			}
			if channel != "" {
				if sel.Channel, err = parseChannel(channel); err != nil {
					return err
				}
			}
			for _, s := range states {
				for _, p := range strings.Split(s, ",") {
					if p = strings.TrimSpace(p); p != "" {
						sel.States = append(sel.States, reminder.State(p))
					}
				}
			}
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			res, err := ops.Replay(ctx, pool, now, sel, d)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			printReplay(out, res, d)
			return nil
		},
	}
	f := cmd.Flags()
	df.register(f, true)
	f.Int64SliceVar(&ids, "id", nil, "reminder IDs (repeatable, comma-separated)")
	f.StringVar(&from, "from", "", "due at or after this time (RFC 3339, now, now-2h)")
	f.StringVar(&to, "to", "", "due before this time (RFC 3339, now, now-2h)")
	f.StringVar(&channel, "channel", "", `only this channel: "email", "sms" or "webhook"`)
	f.StringVar(&tenant, "tenant", "", "only this tenant")
	f.StringSliceVar(&states, "state", nil,
		"only these states (default failed,quarantined,leased,enqueued,retrying; the last three only when stuck)")
	f.DurationVar(&stuckFor, "stuck-for", ops.DefaultStuckFor,
		"a leased, enqueued or retrying reminder is selected once stuck this long (keep at or above the reconciler's --overdue)")
	f.IntVar(&batch, "batch", ops.DefaultReplayBatch, "reminders per statement")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printReplay(w io.Writer, res ops.ReplayResult, d ops.Decision) {
	var byState []string
	for _, s := range reminder.States {
		if n := res.ByState[s]; n > 0 {
			byState = append(byState, fmt.Sprintf("%s %d", s, n))
		}
	}
	match := fmt.Sprintf("%d reminders match", res.Matched)
	if len(byState) > 0 {
		match += " (" + strings.Join(byState, ", ") + ")"
	}
	policy := "attempts reset"
	if d.Attempts == ops.KeepAttempts {
		policy = "attempts kept"
	}
	if res.DryRun {
		fmt.Fprintf(w, "dry run (nothing changed): %s\n", match)
		fmt.Fprintf(w, "would replay %d to pending (%s)\n", res.Replayed, policy)
	} else {
		fmt.Fprintln(w, match)
		fmt.Fprintf(w, "replayed %d to pending (%s); the dispatcher publishes them on its next run\n", res.Replayed, policy)
	}
	refused := res.RefusedDeadline + res.RefusedPurged
	if refused > 0 {
		fmt.Fprintf(w, "refused %d: %d past their deadline or less than %s before it, %d with their payload purged",
			refused, res.RefusedDeadline, d.Margin, res.RefusedPurged)
		if len(res.Refused) > 0 {
			fmt.Fprintf(w, " (%s", joinIDs(res.Refused))
			if len(res.Refused) < refused {
				fmt.Fprint(w, ", …")
			}
			fmt.Fprint(w, ")")
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintln(w, "refused 0")
	}
	if res.MovedOn > 0 {
		fmt.Fprintf(w, "%d changed while being replayed and were left alone; run again to reconsider them\n", res.MovedOn)
	}
	if len(res.NotSelected) > 0 {
		ids := make([]int64, 0, len(res.NotSelected))
		for id := range res.NotSelected {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		var parts []string
		for _, id := range ids {
			parts = append(parts, fmt.Sprintf("%d (%s)", id, whyNotSelected(res.NotSelected[id])))
		}
		fmt.Fprintf(w, "not selected: %s\n", strings.Join(parts, ", "))
	}
}

func joinIDs(ids []int64) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = fmt.Sprint(id)
	}
	return strings.Join(out, ", ")
}

func whyNotSelected(st reminder.State) string {
	switch st {
	case "":
		return "no such reminder"
	case reminder.Pending:
		return "pending: already waiting for the dispatcher"
	case reminder.Sending:
		return "sending: an attempt is in flight"
	case reminder.Leased, reminder.Enqueued, reminder.Retrying:
		return string(st) + ": not stuck for --stuck-for yet"
	case reminder.Failed, reminder.Quarantined:
		return string(st) + ": outside --from/--to, --channel, --tenant or --state"
	}
	return string(st) + ": final, never replayed"
}
