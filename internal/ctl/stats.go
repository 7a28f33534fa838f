package ctl

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// PrintStats prints what `nudgectl stats` shows: the channel × state table
// first (PrintOutcomeTable, unchanged), a blank line, the terminal outcomes
// of the recent window, the health numbers in the runbook's order, the
// counts by tenant, and the verdict (st.Verdict) last, where it is seen.
func PrintStats(w io.Writer, st *ops.Stats, verdict []ops.Answer) error {
	var estimated func(string) bool
	if len(st.Estimated) > 0 {
		estimated = st.IsEstimated
	}
	if err := printCountTable(w, st.ByChannel, estimated); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if estimated != nil {
		fmt.Fprintf(w, "~ estimated: %s scheduled for later and the terminal history, from a sample of pages "+
			"(the work in flight and the pending due are exact); --exact counts every row\n\n", strings.Join(st.Estimated, ", "))
	}
	fmt.Fprintf(w, "last %s (terminal outcomes by channel):\n", ops.RecentWindow)
	if err := printRecent(w, st.Recent); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	age := func(t *time.Time) string {
		if t == nil {
			return "none"
		}
		return fmt.Sprintf("%s (since %s)", st.Age(t).Round(time.Second), t.UTC().Format(time.RFC3339))
	}
	newest := "none"
	if st.NewestCreated != nil {
		newest = fmt.Sprintf("%s ago (%s)", st.Age(st.NewestCreated).Round(time.Second), st.NewestCreated.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "newest reminder scheduled (intake)\t%s\n", newest)
	fmt.Fprintf(tw, "oldest due, pending (dispatcher)\t%s\n", age(st.OldestDue))
	cut := "unknown: no dispatcher run recorded in the last day and no claim among the newest events"
	if st.Dispatch.Cutoff != nil {
		cut = fmt.Sprintf("%s, lag %s (from %s", st.Dispatch.Cutoff.UTC().Format(time.RFC3339),
			st.CutoffLag().Round(time.Second), st.Dispatch.Source)
		if st.Dispatch.Source == "dispatch_runs" {
			cut += fmt.Sprintf(", %d runs in the last day", st.Dispatch.RunsLastDay)
		}
		cut += ")"
	}
	if st.Dispatch.Note != "" {
		cut += "; " + st.Dispatch.Note
	}
	fmt.Fprintf(tw, "dispatcher cutoff\t%s\n", cut)
	fmt.Fprintf(tw, "oldest enqueued (workers)\t%s\n", age(st.OldestEnqueued))
	fmt.Fprintf(tw, "oldest overdue retry\t%s\n", age(st.OldestRetryDue))
	owed := st.OldestUnexpired
	if owed == nil || (st.OldestDeadLease != nil && st.OldestDeadLease.Before(*owed)) {
		owed = st.OldestDeadLease
	}
	fmt.Fprintf(tw, "oldest repair owed (reconciler)\t%s\n", age(owed))
	fmt.Fprintf(tw, "deadline misses (expired)\t%s\n", windows(st.DeadlineMisses))
	fmt.Fprintf(tw, "quarantined (dead-lettered)\t%s\n", windows(st.Quarantined))
	switch {
	case st.DeadLettersErr != "":
		fmt.Fprintf(tw, "dead-letter queues\tunknown: %s\n", st.DeadLettersErr)
	case st.DeadLetters == nil:
		fmt.Fprintf(tw, "dead-letter queues\tnot asked (pass --amqp-url)\n")
	default:
		var parts []string
		for _, c := range reminder.Channels {
			parts = append(parts, fmt.Sprintf("%s %d", c, st.DeadLetters[string(c)]))
		}
		fmt.Fprintf(tw, "dead-letter queues\t%s messages\n", strings.Join(parts, ", "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := printTenantTable(w, st.ByTenant, estimated); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return printVerdict(w, verdict)
}

// recentOutcomes are the columns of the recent window's table.
var recentOutcomes = []reminder.State{reminder.Delivered, reminder.Failed, reminder.Expired, reminder.Canceled}

func printRecent(w io.Writer, recent map[string]map[string]int64) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "CHANNEL\t")
	for _, o := range recentOutcomes {
		fmt.Fprintf(tw, "%s\t", o)
	}
	fmt.Fprintln(tw, "per minute\t")
	for _, c := range reminder.Channels {
		fmt.Fprintf(tw, "%s\t", c)
		var sum int64
		for _, o := range recentOutcomes {
			n := recent[string(c)][string(o)]
			sum += n
			fmt.Fprintf(tw, "%d\t", n)
		}
		fmt.Fprintf(tw, "%.1f\t\n", float64(sum)/ops.RecentWindow.Minutes())
	}
	return tw.Flush()
}

func printVerdict(w io.Writer, answers []ops.Answer) error {
	verdict := "OK: every answer is within objective"
	if !ops.Healthy(answers) {
		verdict = "BAD: an answer is over objective (exit status 6)"
	}
	fmt.Fprintf(w, "verdict: %s\n", verdict)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	last := ""
	for _, a := range answers {
		q := ""
		if a.Question != last {
			q, last = a.Question, a.Question
		}
		mark := "ok"
		if !a.OK {
			mark = "BAD"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", q, mark, a.Check, a.Value)
	}
	return tw.Flush()
}

func windows(m map[string]ops.Window) string {
	var parts []string
	for _, c := range reminder.Channels {
		w := m[string(c)]
		parts = append(parts, fmt.Sprintf("%s %d last hour, %d last day", c, w.Hour, w.Day))
	}
	return strings.Join(parts, "; ")
}

func printTenantTable(w io.Writer, counts map[string]map[string]int64, estimated func(string) bool) error {
	est := func(s reminder.State) bool { return estimated != nil && estimated(string(s)) }
	anyEst := false
	for _, s := range reminder.States {
		anyEst = anyEst || est(s)
	}
	mark := func(approx bool) string {
		if approx {
			return "~"
		}
		return ""
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "TENANT\t")
	for _, s := range reminder.States {
		fmt.Fprintf(tw, "%s\t", s)
	}
	fmt.Fprintln(tw, "total\t")
	tenants := make([]string, 0, len(counts))
	for t := range counts {
		tenants = append(tenants, t)
	}
	sort.Strings(tenants)
	for _, t := range tenants {
		fmt.Fprintf(tw, "%s\t", t)
		var sum int64
		for _, s := range reminder.States {
			n := counts[t][string(s)]
			sum += n
			fmt.Fprintf(tw, "%s%d\t", mark(est(s)), n)
		}
		fmt.Fprintf(tw, "%s%d\t\n", mark(anyEst), sum)
	}
	return tw.Flush()
}
