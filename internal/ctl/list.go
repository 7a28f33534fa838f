package ctl

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// filterFlags select reminders for list and the bulk actions.
type filterFlags struct {
	ids                                      []int64
	tenant, channel, keyPrefix, reason       string
	states                                   []string
	dueFrom, dueTo, deadlineFrom, deadlineTo string
	late                                     bool
}

func (ff *filterFlags) register(fs *pflag.FlagSet) {
	fs.Int64SliceVar(&ff.ids, "id", nil, "reminder IDs (repeat or comma-separate)")
	fs.StringVar(&ff.tenant, "tenant", "", "tenant")
	fs.StringSliceVar(&ff.states, "state", nil, "states (repeat or comma-separate)")
	fs.StringVar(&ff.channel, "channel", "", `"email" or "sms"`)
	fs.StringVar(&ff.keyPrefix, "key-prefix", "", "keys starting with this (a whole key selects that reminder)")
	fs.StringVar(&ff.dueFrom, "due-from", "", "due at or after (RFC 3339, now, now-2h)")
	fs.StringVar(&ff.dueTo, "due-to", "", "due before (RFC 3339, now, now-2h)")
	fs.StringVar(&ff.deadlineFrom, "deadline-from", "", "deadline at or after (RFC 3339, now, now-2h)")
	fs.StringVar(&ff.deadlineTo, "deadline-to", "", "deadline before (RFC 3339, now, now+2h)")
	fs.BoolVar(&ff.late, "late", false, "only reminders past due and not terminal")
	fs.StringVar(&ff.reason, "reason-contains", "", "reason or last error contains this (any case)")
}

func (ff *filterFlags) filter(now time.Time) (ops.Filter, error) {
	f := ops.Filter{IDs: ff.ids, Tenant: ff.tenant, Channel: reminder.Channel(strings.ToLower(ff.channel)),
		KeyPrefix: ff.keyPrefix, Late: ff.late, Reason: ff.reason}
	for _, s := range ff.states {
		f.States = append(f.States, reminder.State(strings.ToLower(strings.TrimSpace(s))))
	}
	var err error
	for _, t := range []struct {
		flag, val string
		dst       **time.Time
	}{
		{"due-from", ff.dueFrom, &f.DueFrom}, {"due-to", ff.dueTo, &f.DueTo},
		{"deadline-from", ff.deadlineFrom, &f.DeadlineFrom}, {"deadline-to", ff.deadlineTo, &f.DeadlineTo},
	} {
		if *t.dst, err = parseWhen(t.flag, t.val, now); err != nil {
			return f, err
		}
	}
	return f, f.Validate()
}

func listCmd(connect connector) *cobra.Command {
	var (
		ff             filterFlags
		page           ops.Page
		asJSON, reveal bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List reminders by tenant, state, channel, key prefix, due or deadline range, lateness or reason, newest first, a page at a time",
		Long: fmt.Sprintf(`list prints the reminders the filter selects, newest first, one page at a time
(--page-size, at most %d); the last line names the flag that prints the next page (--before,
a keyset cursor: pages stay stable while reminders are added). The count of the whole
selection is exact up to %d and says "more than %d" beyond. Recipients are masked unless
--show-recipients.`, ops.MaxPageSize, ops.CountCap, ops.CountCap),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			f, err := ff.filter(now)
			if err != nil {
				return err
			}
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			res, err := ops.List(ctx, pool, now, f, page)
			if err != nil {
				return err
			}
			if !reveal {
				for i := range res.Items {
					res.Items[i].Recipient = worker.MaskRecipient(res.Items[i].Recipient)
				}
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			printList(cmd.OutOrStdout(), res, now)
			return nil
		},
	}
	f := cmd.Flags()
	ff.register(f)
	f.IntVar(&page.Size, "page-size", ops.DefaultPageSize, "reminders per page")
	f.Int64Var(&page.Before, "before", 0, "the page after this cursor (printed at the end of the previous page)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.BoolVar(&reveal, "show-recipients", false, "print recipients in full")
	return cmd
}

func printList(w io.Writer, res ops.ListPage, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tKEY\tCHANNEL\tRECIPIENT\tSTATE\tDUE\tDEADLINE\tATTEMPTS\tREASON")
	for _, it := range res.Items {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", it.ID, it.Tenant, oneLine(it.Key, 40), it.Channel,
			it.Recipient, it.State, it.DueAt.UTC().Format(time.RFC3339), it.Deadline.UTC().Format(time.RFC3339),
			it.Attempts, oneLine(it.Reason, 60))
	}
	tw.Flush()
	fmt.Fprintf(w, "%d shown of %s selected", len(res.Items), res.Count)
	if res.Next != 0 {
		fmt.Fprintf(w, "; next page: --before %d", res.Next)
	}
	fmt.Fprintln(w)
}

func bulkCmd(connect connector) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bulk",
		Short: "Cancel, replay or expire every reminder a filter selects (dry run first; a reason and an audit row each)",
		Long: `bulk applies one decision to every reminder the filter selects (the filter flags of list),
with the fenced statement of the single-reminder command: cancel as ` + "`nudgectl cancel`" + `, replay as
` + "`nudgectl replay --id`" + `, expire as ` + "`nudgectl dlq expire`" + ` (quarantined reminders only; their
dead letters are dropped as stale by the next dlq decision). Each reminder is decided in a
transaction of its own with its event and an operator_audit row (action bulk.cancel,
bulk.replay or bulk.expire), so an interrupted run keeps what it did and a second run skips it.

--reason is required. --dry-run prints how many would change and why the others would not.
A selection larger than --max is refused. On a terminal, a progress bar shows on standard
error when the run takes more than a second.`,
	}
	for _, a := range []ops.BulkAction{ops.BulkCancel, ops.BulkReplay, ops.BulkExpire} {
		cmd.AddCommand(bulkActionCmd(connect, a))
	}
	return cmd
}

func bulkActionCmd(connect connector, action ops.BulkAction) *cobra.Command {
	var (
		ff     filterFlags
		df     decisionFlags
		opt    ops.BulkOptions
		asJSON bool
	)
	replay := action == ops.BulkReplay
	cmd := &cobra.Command{
		Use:   string(action),
		Short: fmt.Sprintf("%s every reminder the filter selects", strings.ToUpper(string(action[:1]))+string(action[1:])),
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			f, err := ff.filter(now)
			if err != nil {
				return err
			}
			d, err := df.decision(replay)
			if err != nil {
				return err
			}
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			bar := newProgressBar(cmd.ErrOrStderr(), "bulk "+string(action))
			opt.Progress = bar.update
			res, err := ops.Bulk(ctx, pool, now, action, f, d, opt)
			bar.finish()
			if asJSON && err == nil {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			printBulk(cmd.OutOrStdout(), res)
			return err
		},
	}
	fs := cmd.Flags()
	ff.register(fs)
	df.register(fs, replay)
	fs.IntVar(&opt.Max, "max", ops.DefaultBulkMax, "refuse a selection of more reminders than this")
	if replay {
		fs.DurationVar(&opt.StuckFor, "stuck-for", ops.DefaultStuckFor,
			"replay leased, enqueued and retrying reminders only once overdue this long")
	}
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printBulk(w io.Writer, res ops.BulkResult) {
	verb := map[ops.BulkAction]string{ops.BulkCancel: "canceled", ops.BulkReplay: "replayed", ops.BulkExpire: "expired"}[res.Action]
	if res.DryRun {
		fmt.Fprintf(w, "dry run: %d selected; %d would be %s", res.Selected, res.Changed, verb)
	} else {
		fmt.Fprintf(w, "%d selected; %d %s", res.Selected, res.Changed, verb)
	}
	fmt.Fprintln(w)
	for _, why := range sortedKeys(res.Skipped) {
		fmt.Fprintf(w, "  %d skipped: %s\n", res.Skipped[why], why)
	}
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// progressBar draws a one-line bar on a terminal once a run has taken more
// than a second (a quick run shows nothing), redrawn at most ten times a
// second, and clears it at the end. Not on a terminal, it does nothing.
// Written here rather than taken from a library: it is thirty lines.
type progressBar struct {
	w           io.Writer
	label       string
	on, drawn   bool
	start, last time.Time
	now         func() time.Time
}

func newProgressBar(w io.Writer, label string) *progressBar {
	f, ok := w.(*os.File)
	on := ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
	return &progressBar{w: w, label: label, on: on, start: time.Now(), now: time.Now}
}

func (p *progressBar) update(done, total int) {
	if !p.on {
		return
	}
	now := p.now()
	if now.Sub(p.start) < time.Second || (now.Sub(p.last) < 100*time.Millisecond && done < total) {
		return
	}
	p.last, p.drawn = now, true
	fmt.Fprint(p.w, "\r\033[K"+renderProgress(p.label, done, total, now.Sub(p.start)))
}

func (p *progressBar) finish() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// renderProgress is the bar's line: label, a 30-cell bar, done/total, rate
// and time left.
func renderProgress(label string, done, total int, elapsed time.Duration) string {
	const width = 30
	filled := 0
	if total > 0 {
		filled = min(width, done*width/total)
	}
	line := fmt.Sprintf("%s [%s%s] %d/%d", label, strings.Repeat("=", filled), strings.Repeat(" ", width-filled), done, total)
	if elapsed > 0 && done > 0 {
		rate := float64(done) / elapsed.Seconds()
		left := time.Duration(float64(total-done) / rate * float64(time.Second)).Round(time.Second)
		line += fmt.Sprintf(" %.0f/s, %s left", rate, left)
	}
	return line
}
