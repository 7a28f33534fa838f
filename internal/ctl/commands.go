package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
	"github.com/nudgehq/nudge/schema"
)

// Command returns the nudgectl root command.
func Command() *cobra.Command {
	var common config.Common
	root := &cobra.Command{
		Use:   "nudgectl",
		Short: "Operate Nudge: migrate the schema and declare the broker topology, schedule, cancel, inspect and replay reminders, handle dead letters",
	}
	common.RegisterDB(root.PersistentFlags())
	connect := func(cmd *cobra.Command) (context.Context, *pgxpool.Pool, func(), error) {
		ctx, stop := config.SignalContext()
		pool, err := common.Pool(ctx)
		if err != nil {
			stop()
			return nil, nil, nil, err
		}
		return ctx, pool, func() { pool.Close(); stop() }, nil
	}
	root.AddCommand(migrateCmd(connect), scheduleCmd(connect), cancelCmd(connect), rescheduleCmd(connect),
		updateCmd(connect), showCmd(connect), statsCmd(connect), replayCmd(connect), dlqCmd(connect), brokerCmd(), keysCmd(),
		listCmd(connect), bulkCmd(connect), consoleCmd(connect, &common), campaignCmd(connect))
	commandLineOnly(root)
	withExitCodes(root)
	return root
}

// envFlags are the only nudgectl flags that fall back to NUDGE_* variables:
// where the database and broker are, and logging. What to schedule, select,
// replay, expire or cancel must be typed.
var envFlags = map[string]bool{
	"database-url": true, "log-level": true, "log-format": true, "allow-insecure-tls": true,
	"amqp-url": true, "queue-prefix": true, "signing-keys": true,
	// migrate's lock bounds: how the migration Job behaves, not what it does.
	"lock-timeout": true, "lock-wait": true,
}

func commandLineOnly(c *cobra.Command) {
	var names []string
	c.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if !envFlags[f.Name] {
			names = append(names, f.Name)
		}
	})
	config.CommandLineOnly(c.Flags(), names...)
	for _, sub := range c.Commands() {
		commandLineOnly(sub)
	}
}

type connector func(cmd *cobra.Command) (context.Context, *pgxpool.Pool, func(), error)

func migrateCmd(connect connector) *cobra.Command {
	var (
		tf           topologyFlags
		declare      bool
		afterRollout bool
		opts         schema.Options
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the embedded schema migrations, and with --declare-topology declare the broker topology (idempotent; safe while the fleet runs)",
		Long: `migrate applies the embedded schema migrations under an advisory lock. With
--declare-topology it then declares the broker topology (exchanges, queues, bindings) as
` + "`nudgectl broker declare`" + ` does, connecting with --amqp-url as a RabbitMQ user allowed to
configure Nudge's names: the rest of the fleet only checks that the topology exists.

A migration marked after-rollout removes what only the previous release's binaries need (the
state mirror of schema 32, say). migrate stops before the first such migration not yet applied
and names what waits; once every component runs this release, migrate --after-rollout applies it
and everything after it. On a fresh database (no migration recorded) no binary of an earlier
release can be running, so migrate applies everything at once, after-rollout migrations included.

A migration that changes a table's definition needs its ACCESS EXCLUSIVE lock, and while it waits
for one PostgreSQL queues every later statement on that table behind it: behind a long transaction
(a batch import) the whole fleet would stall. So each migration waits at most --lock-timeout for a
lock; then it rolls back (nothing applied), says so on stderr, and tries again after a pause (0.5s
doubling to 8s), until --lock-wait has passed. Then migrate fails naming the migration and the
session holding the table: let that transaction finish or end it, and run migrate again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.Validate(); err != nil {
				return usage(err)
			}
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			fresh := false
			if !afterRollout {
				if fresh, err = schema.Fresh(ctx, pool); err != nil {
					return err
				}
			}
			opts.Progress = cmd.ErrOrStderr()
			migrate := opts.Migrate
			if afterRollout || fresh {
				migrate = opts.MigrateAfterRollout
			}
			applied, err := migrate(ctx, pool)
			if err != nil {
				return err
			}
			waiting, err := schema.Waiting(ctx, pool)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch {
			case len(applied) > 0 && fresh:
				fmt.Fprintf(out, "applied migrations %v (a fresh database: no binary of an earlier release "+
					"runs on it, so the after-rollout migrations applied too)\n", applied)
			case len(applied) > 0:
				fmt.Fprintf(out, "applied migrations %v\n", applied)
			case len(waiting) == 0:
				fmt.Fprintln(out, "schema is up to date")
			default:
				fmt.Fprintln(out, "no migration to apply before the rollout completes")
			}
			if len(waiting) > 0 {
				names := make([]string, len(waiting))
				for i, m := range waiting {
					names[i] = m.String()
				}
				fmt.Fprintf(out, "waiting for the rollout: %s; once no binary of the previous release runs, "+
					"run nudgectl migrate --after-rollout\n", strings.Join(names, ", "))
			}
			if !declare {
				return nil
			}
			return tf.declare(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.BoolVar(&afterRollout, "after-rollout", false,
		"also apply the after-rollout migrations: only once every component runs this release")
	f.BoolVar(&declare, "declare-topology", false,
		"also declare the broker topology, connecting with --amqp-url as a user allowed to configure it")
	f.DurationVar(&opts.LockTimeout, "lock-timeout", schema.DefaultLockTimeout,
		"longest wait of a migration for a table lock (the fleet's statements on that table queue behind it meanwhile); "+
			"then it rolls back and is retried")
	f.DurationVar(&opts.LockWait, "lock-wait", schema.DefaultLockWait,
		"how long to keep retrying a migration that times out on a lock before failing")
	tf.register(f)
	return cmd
}

// scheduleBatch is how many reminders one intake statement carries.
const scheduleBatch = 2000

func scheduleCmd(connect connector) *cobra.Command {
	var (
		file                                               string
		tenant, key, channel, recipient, template, dataStr string
		dueAt, deadline                                    string
		tz, dueLocal, deadlineLocal, window                string
		actor                                              string
	)
	cmd := &cobra.Command{
		Use:   "schedule",
		Short: "Schedule one reminder from flags, or many from a JSON Lines file (-f FILE, - for stdin)",
		Long: `schedule records reminder intent, idempotently on (tenant, key): repeating a reminder with
the same content returns the existing one; the same key with different content is refused.

With -f, each line is a JSON object with the fields tenant, key, channel ("email", "sms" or "webhook"),
recipient, template, data (an object) and due_at and deadline (RFC 3339), or, instead of
either time, due_local and deadline_local: a local wall-clock time ("2027-03-28T09:00") in the
zone tz ("Europe/Stockholm"); and window, a send window in that zone ("08:00-21:00",
"mon-fri 09:00-17:00", "any"; absent: the tenant's policy). Bad lines are
reported with their line number, field and reason; good lines are still accepted. The
exit status is 0 when every line was accepted, 2 when some were rejected.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			if file != "" {
				return scheduleFile(ctx, cmd, pool, file, actor)
			}
			line := map[string]any{"tenant": tenant, "key": key, "channel": channel, "recipient": recipient,
				"template": template, "due_at": dueAt, "deadline": deadline}
			if dataStr != "" {
				line["data"] = json.RawMessage(dataStr)
			}
			for k, v := range map[string]string{"tz": tz, "due_local": dueLocal, "deadline_local": deadlineLocal, "window": window} {
				if v != "" {
					line[k] = v
				}
			}
			raw, err := json.Marshal(line)
			if err != nil {
				return fmt.Errorf("--data: must be a JSON object: %w", err)
			}
			req, lerr := ParseLine(1, raw)
			if lerr != nil {
				return fmt.Errorf("--%s %s", strings.ReplaceAll(lerr.Field, "_", "-"), lerr.Reason)
			}
			out, err := intake.ScheduleManyAs(ctx, pool, actor, []intake.Request{req})
			if err != nil {
				return err
			}
			if err := out[0].Err; err != nil {
				var ve *intake.ValidationError
				if errors.As(err, &ve) {
					return fmt.Errorf("--%s %s", strings.ReplaceAll(ve.Field, "_", "-"), ve.Reason)
				}
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s reminder %d\n", out[0].Status, out[0].ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "JSON Lines file of reminders (- reads standard input)")
	f.StringVar(&tenant, "tenant", "", "tenant owning the reminder")
	f.StringVar(&key, "key", "", "logical key, unique per tenant")
	f.StringVar(&channel, "channel", "", `"email", "sms" or "webhook"`)
	f.StringVar(&recipient, "recipient", "", "email address or E.164 phone number")
	f.StringVar(&template, "template", "", "template name")
	f.StringVar(&dataStr, "data", "", "template data, a JSON object")
	f.StringVar(&dueAt, "due-at", "", "earliest send time, RFC 3339")
	f.StringVar(&deadline, "deadline", "", "business deadline, RFC 3339: no send starts at or after it")
	f.StringVar(&tz, "tz", "", `recipient's IANA time zone, e.g. "Europe/Stockholm" (default UTC)`)
	f.StringVar(&dueLocal, "due-local", "", `due time as local wall-clock time in --tz, e.g. "2027-03-28T09:00" (instead of --due-at)`)
	f.StringVar(&deadlineLocal, "deadline-local", "", "deadline as local wall-clock time in --tz (instead of --deadline)")
	f.StringVar(&window, "window", "", `send window in --tz, e.g. "08:00-21:00" or "mon-fri 09:00-17:00" (default: the tenant's policy)`)
	f.StringVar(&actor, "actor", "nudgectl", "name recorded as the author of the scheduled events")
	return cmd
}

func scheduleFile(ctx context.Context, cmd *cobra.Command, pool *pgxpool.Pool, path, actor string) error {
	var in io.Reader = cmd.InOrStdin()
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("opening %s: %w", path, err)
		}
		defer f.Close()
		in = f
	}
	errOut := cmd.ErrOrStderr()
	progress := isatty.IsTerminal(os.Stderr.Fd())
	var (
		pending                   []ParsedLine
		created, exists, rejected int
		start                     = time.Now()
	)
	// Rejections are printed per batch in line order.
	var bad []*LineError
	report := func(e *LineError) {
		rejected++
		bad = append(bad, e)
	}
	printBad := func() {
		if len(bad) == 0 {
			return
		}
		if progress {
			fmt.Fprint(errOut, "\r\033[K")
		}
		slices.SortFunc(bad, func(a, b *LineError) int { return a.Line - b.Line })
		for _, e := range bad {
			fmt.Fprintln(errOut, e)
		}
		bad = bad[:0]
	}
	flush := func() error {
		defer printBad()
		if len(pending) == 0 {
			return nil
		}
		reqs := make([]intake.Request, len(pending))
		for i, p := range pending {
			reqs[i] = p.Req
		}
		out, err := intake.ScheduleManyAs(ctx, pool, actor, reqs)
		if err != nil {
			return fmt.Errorf("lines %d-%d: %w", pending[0].Line, pending[len(pending)-1].Line, err)
		}
		for i, o := range out {
			var ve *intake.ValidationError
			switch {
			case errors.As(o.Err, &ve):
				report(&LineError{Line: pending[i].Line, Field: ve.Field, Reason: ve.Reason})
			case o.Err != nil:
				report(&LineError{Line: pending[i].Line, Reason: o.Err.Error()})
			case o.Status == intake.Created:
				created++
			default:
				exists++
			}
		}
		pending = pending[:0]
		if progress {
			fmt.Fprintf(errOut, "\r\033[K%d scheduled, %d already scheduled, %d rejected (%.0f/s)",
				created, exists, rejected, float64(created+exists+rejected)/time.Since(start).Seconds())
		}
		return nil
	}
	lines, err := ReadLines(in, func(p ParsedLine) error {
		pending = append(pending, p)
		if len(pending) >= scheduleBatch {
			return flush()
		}
		return nil
	}, report)
	if err == nil {
		err = flush()
	}
	if progress {
		fmt.Fprint(errOut, "\r\033[K")
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%d lines: %d scheduled, %d already scheduled, %d rejected in %s\n",
		lines, created, exists, rejected, time.Since(start).Round(time.Millisecond))
	if err != nil {
		return err // lines accepted before the failure stay accepted
	}
	if rejected > 0 {
		return &config.ExitError{Code: 2, Err: fmt.Errorf("%d of %d lines rejected", rejected, lines)}
	}
	return nil
}

// lookup finds a reminder by its ID argument or by --tenant and --key.
func lookup(ctx context.Context, pool *pgxpool.Pool, args []string, tenant, key string) (reminder.Reminder, error) {
	switch {
	case len(args) == 1:
		id, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil {
			return reminder.Reminder{}, usage(fmt.Errorf("reminder ID %q: must be a number", args[0]))
		}
		return intake.Get(ctx, pool, id)
	case tenant != "" && key != "":
		return intake.GetByKey(ctx, pool, tenant, key)
	}
	return reminder.Reminder{}, usage(errors.New("name a reminder: an ID argument, or --tenant and --key"))
}

func cancelCmd(connect connector) *cobra.Command {
	var (
		tenant, key, actor, reason string
		pf                         prefixFlags
	)
	cmd := &cobra.Command{
		Use:   "cancel [ID]",
		Short: "Cancel a reminder that has not been sent (by ID, or --tenant and --key), or every one of --tenant under --key-prefix",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if pf.prefix != "" {
				return pf.cancel(cmd, connect, args, tenant, actor, reason)
			}
			if pf.dryRun {
				return errors.New("--dry-run goes with --key-prefix")
			}
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			r, err := lookup(ctx, pool, args, tenant, key)
			if err != nil {
				return err
			}
			st, err := intake.Cancel(ctx, pool, r.Tenant, r.Key, actor, reason)
			if err != nil {
				return err
			}
			switch st {
			case reminder.Canceled:
				if r.State == reminder.Canceled {
					// nudge_cancel answers "canceled" for one canceled before, too.
					return fmt.Errorf("reminder %d already ended as %s", r.ID, st)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "reminder %d canceled\n", r.ID)
				return nil
			case reminder.Sending:
				return fmt.Errorf("reminder %d is being sent right now; its outcome will be recorded", r.ID)
			default:
				return fmt.Errorf("reminder %d already ended as %s", r.ID, st)
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&tenant, "tenant", "", "tenant of the reminder (with --key)")
	f.StringVar(&key, "key", "", "logical key of the reminder (with --tenant)")
	f.StringVar(&actor, "actor", "nudgectl:"+os.Getenv("USER"), "who cancels, for the audit trail")
	f.StringVar(&reason, "reason", "canceled by operator", "why, for the audit trail")
	pf.register(f)
	return cmd
}

func showCmd(connect connector) *cobra.Command {
	var tenant, key string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show [ID]",
		Short: "Print a reminder's state and its event timeline (by ID, or --tenant and --key)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			r, err := lookup(ctx, pool, args, tenant, key)
			if err != nil {
				return err
			}
			evs, err := intake.Events(ctx, pool, r.ID)
			if err != nil {
				return err
			}
			pub, err := ops.PublishOf(ctx, pool, r.ID)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"reminder": r, "events": evs, "publish": pub})
			}
			window, err := intake.SendWindow(ctx, pool, r)
			if err != nil {
				return err
			}
			return printReminder(out, r, evs, pub, window)
		},
	}
	f := cmd.Flags()
	f.StringVar(&tenant, "tenant", "", "tenant of the reminder (with --key)")
	f.StringVar(&key, "key", "", "logical key of the reminder (with --tenant)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printReminder prints a reminder, its send window and its events, every
// time in UTC and in the recipient's zone.
func printReminder(out io.Writer, r reminder.Reminder, evs []reminder.Event, pub ops.Publish, window localtime.Window) error {
	loc, zerr := r.Zone()
	both := func(t time.Time) string { return localAndUTC(t, loc) }
	ts := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return both(*t)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "reminder\t%d\n", r.ID)
	fmt.Fprintf(tw, "tenant / key\t%s / %s\n", r.Tenant, r.Key)
	fmt.Fprintf(tw, "channel\t%s to %s, template %s\n", r.Channel, r.Recipient, r.Template)
	fmt.Fprintf(tw, "state\t%s\n", r.State)
	if r.Reason != "" {
		fmt.Fprintf(tw, "reason\t%s\n", r.Reason)
	}
	zone := loc.String()
	if r.TZ == "" {
		zone = "UTC (none given)"
	} else if zerr != nil {
		zone = r.TZ + " (unknown to this nudgectl: times shown in UTC)"
	}
	fmt.Fprintf(tw, "time zone\t%s\n", zone)
	whose := "its own"
	if r.Window == nil {
		whose = "the policy for tenant " + r.Tenant + " on " + string(r.Channel)
	}
	fmt.Fprintf(tw, "send window\t%s (%s, in %s)\n", window, whose, loc)
	fmt.Fprintf(tw, "due at\t%s\n", both(r.DueAt))
	if r.RequestedDueAt != nil {
		fmt.Fprintf(tw, "requested due at\t%s (moved to the window's opening)\n", both(*r.RequestedDueAt))
	}
	fmt.Fprintf(tw, "deadline\t%s\n", both(r.Deadline))
	fmt.Fprintf(tw, "attempts\t%d (next %s)\n", r.Attempts, ts(r.NextAttemptAt))
	if r.LastError != "" {
		fmt.Fprintf(tw, "last error\t%s\n", r.LastError)
	}
	fmt.Fprintf(tw, "fence / lease until\t%d / %s\n", r.Fence, ts(r.LeaseUntil))
	if pub.Batch != nil {
		confirmed := "publish confirmation not recorded"
		if pub.ConfirmedAt != nil {
			confirmed = "publish confirmed " + ts(pub.ConfirmedAt) + " by " + pub.Actor
		}
		fmt.Fprintf(tw, "dispatch batch\t%d, %s\n", *pub.Batch, confirmed)
	}
	fmt.Fprintf(tw, "idempotency key\t%s\n", r.IdempotencyKey)
	tw.Flush()
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	// A LOCAL column beside the UTC one when the recipient is elsewhere.
	local := func(t time.Time) string { return "" }
	if loc == time.UTC {
		fmt.Fprintln(tw, "TIME\tFROM\tTO\tFENCE\tACTOR\tREASON")
	} else {
		fmt.Fprintln(tw, "TIME (UTC)\tLOCAL\tFROM\tTO\tFENCE\tACTOR\tREASON")
		local = func(t time.Time) string { return t.In(loc).Format("2006-01-02 15:04:05 MST") + "\t" }
	}
	for _, e := range evs {
		from := string(e.From)
		if from == "" {
			from = "-"
		}
		to, reason := string(e.To), e.Reason
		if reminder.IsNote(e.Code) {
			// Not a transition (a dead letter, a dropped one): say what it is.
			to, reason = "(no change)", strings.ReplaceAll(string(e.Code), "_", "-")+": "+reason
		}
		fmt.Fprintf(tw, "%s\t%s%s\t%s\t%d\t%s\t%s\n", e.At.UTC().Format(time.RFC3339Nano), local(e.At),
			from, to, e.Fence, e.Actor, reason)
	}
	return tw.Flush()
}

// localAndUTC formats t in UTC and in loc: "2027-03-28T06:00:00Z (08:00:00
// CEST, 2027-03-28)"; UTC alone when loc is UTC.
func localAndUTC(t time.Time, loc *time.Location) string {
	u := t.UTC().Format(time.RFC3339)
	if loc == time.UTC {
		return u
	}
	return u + " (" + t.In(loc).Format("2006-01-02 15:04:05 MST") + " local)"
}

func statsCmd(connect connector) *cobra.Command {
	var asJSON, exact bool
	var amqpURL, prefix string
	var obj ops.Objectives
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Answer the runbook's questions with a verdict: counts, recent outcomes, oldest waiting work, misses, dead letters, dispatcher lag",
		Long: `stats prints the reminders by channel × state (the table), the terminal outcomes of the last
5 minutes by channel, then how old the oldest waiting work is (pending and due: the dispatcher;
enqueued: the workers; overdue retries; repairs the reconciler owes), the dispatcher's cutoff and
its lag, deadline misses and quarantined reminders in the last hour and day, the dead-letter queue
depths (with --amqp-url), the counts by tenant, and last the verdict: each runbook question
answered, judged by the --max-* objectives.

--json prints the same with ages in seconds (null: nothing waiting) instead of timestamps.

The counts are exact on a small table. Once reminders holds more than 16 MiB (about 100,000
reminders), counting every row would take seconds (every reminder scheduled for later, the whole
retained history): then the work is still counted exactly (pending and due, leased, enqueued,
sending, retrying, quarantined) and the reminders scheduled for later and the terminal history
are estimated from a sample of pages, at the same cost whatever the table holds. Estimated
columns are marked ~ (and listed in the JSON's estimated_states); --exact counts every row.

Exit status: 0 when every answer is within objective, 6 when one is bad (no dispatcher run
recorded, cutoff lag, oldest due or oldest enqueued over objective, nothing finishing while work
waits), 4 when the database cannot be reached, 5 when it has no Nudge schema (run nudgectl migrate).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			st, err := ops.ReadStatsWith(ctx, pool, time.Now(), ops.StatsOptions{Exact: exact})
			if err != nil {
				return err
			}
			if amqpURL != "" {
				depths, err := ops.DLQDepths(amqpURL, broker.Topology{Prefix: prefix})
				if err != nil {
					st.DeadLettersErr = err.Error()
				} else {
					st.DeadLetters = depths
				}
			}
			rep := st.Report(obj)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else if err := PrintStats(cmd.OutOrStdout(), st, rep.Verdict); err != nil {
				return err
			}
			if !rep.Healthy {
				// The verdict said it (and --json stays one JSON document).
				cmd.SilenceErrors = true
				return &config.ExitError{Code: ExitUnhealthy, Err: errors.New("a runbook answer is over objective (see the verdict)")}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON, with ages in seconds")
	f.BoolVar(&exact, "exact", false, "count every reminder exactly, however many there are (seconds at 1M: reads every row)")
	f.StringVar(&amqpURL, "amqp-url", "", "RabbitMQ URL, to report the dead-letter queue depths (empty: not asked)")
	f.StringVar(&prefix, "queue-prefix", broker.DefaultPrefix, "prefix of every exchange and queue name")
	def := ops.Objectives{}.WithDefaults()
	f.DurationVar(&obj.OldestDue, "max-oldest-due", def.OldestDue, "objective: the oldest due, pending reminder's wait")
	f.DurationVar(&obj.CutoffLag, "max-cutoff-lag", def.CutoffLag, "objective: how far the dispatcher's cutoff trails now")
	f.DurationVar(&obj.OldestEnqueued, "max-oldest-enqueued", def.OldestEnqueued,
		"objective: how long a published reminder waits for a worker")
	return cmd
}

// PrintOutcomeTable prints counts as a channel × state table with totals.
func PrintOutcomeTable(w io.Writer, counts map[string]map[string]int64) error {
	return printCountTable(w, counts, nil)
}

// printCountTable is PrintOutcomeTable with the columns of the states
// estimated says are estimates marked ~ (as is every total that adds one).
func printCountTable(w io.Writer, counts map[string]map[string]int64, estimated func(string) bool) error {
	est := func(s reminder.State) bool { return estimated != nil && estimated(string(s)) }
	num := func(n int64, approx bool) string {
		if approx {
			return fmt.Sprintf("~%d", n)
		}
		return fmt.Sprint(n)
	}
	anyEst := false
	for _, s := range reminder.States {
		anyEst = anyEst || est(s)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "CHANNEL\t")
	for _, s := range reminder.States {
		fmt.Fprintf(tw, "%s\t", s)
	}
	fmt.Fprintln(tw, "total\t")
	totals := map[reminder.State]int64{}
	var all int64
	for _, c := range reminder.Channels {
		fmt.Fprintf(tw, "%s\t", c)
		var sum int64
		for _, s := range reminder.States {
			n := counts[string(c)][string(s)]
			totals[s] += n
			sum += n
			fmt.Fprintf(tw, "%s\t", num(n, est(s)))
		}
		all += sum
		fmt.Fprintf(tw, "%s\t\n", num(sum, anyEst))
	}
	fmt.Fprint(tw, "all\t")
	for _, s := range reminder.States {
		fmt.Fprintf(tw, "%s\t", num(totals[s], est(s)))
	}
	fmt.Fprintf(tw, "%s\t\n", num(all, anyEst))
	return tw.Flush()
}
