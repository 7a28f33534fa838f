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
// first (PrintOutcomeTable, unchanged), a blank line, the health numbers in
// the runbook's order, a blank line, and the counts by tenant.
func PrintStats(w io.Writer, st *ops.Stats) error {
	if err := PrintOutcomeTable(w, st.ByChannel); err != nil {
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
	return printTenantTable(w, st.ByTenant)
}

func windows(m map[string]ops.Window) string {
	var parts []string
	for _, c := range reminder.Channels {
		w := m[string(c)]
		parts = append(parts, fmt.Sprintf("%s %d last hour, %d last day", c, w.Hour, w.Day))
	}
	return strings.Join(parts, "; ")
}

func printTenantTable(w io.Writer, counts map[string]map[string]int64) error {
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
			fmt.Fprintf(tw, "%d\t", n)
		}
		fmt.Fprintf(tw, "%d\t\n", sum)
	}
	return tw.Flush()
}
