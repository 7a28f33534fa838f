package ctl

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/pkg/localtime"
)

// The campaign commands of issue 15's second slice: create (with its due
// rules and admission), stage, cohort and compare. campaign.go registers them.

// maxPrintedErrors bounds the bad lines stage prints (all are stored).
const maxPrintedErrors = 100

type createFlags struct {
	s                      campaign.Spec
	due, dueLocal, atLocal string
	deadline               string
	daysBefore             int
	limits                 string
	b                      campaign.Budget
	plannerSliceSize       int
}

func campaignCreateCmd(connect connector) *cobra.Command {
	var f createFlags
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a campaign, if the window to its deadline can cover it (creating the same --tenant and --name again returns the first)",
		Long: `create records a campaign for the planner. Give one due rule: --due (an instant),
--due-local (one wall-clock time in each recipient's zone), or --days-before each recipient's
own date (at that instant, or with --at-local at a local time of day). A row's zone is the
source's zone column, or --default-zone (UTC) when it is empty.

Admission: the campaign is refused, with every number, unless the time from now to --deadline
covers planning (audience / slice size x the slice time measured from this installation's
checkpoints, 10 ms per row until 10 slices are measured), delivery (audience / the channel's
rate for the tenant in --limits, the workers' limits file) and one reminder's retries
(--max-attempts, --backoff-base, --backoff-max, the workers' flags). --admit-anyway REASON
creates it regardless and records the reason with the numbers.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(cmd, connect) },
	}
	fs := cmd.Flags()
	fs.StringVar(&f.s.Tenant, "tenant", "", "tenant of the campaign (required)")
	fs.StringVar(&f.s.Name, "name", "", "name, unique per tenant (required)")
	fs.StringVar(&f.s.Channel, "channel", "email", "email, sms or webhook")
	fs.StringVar(&f.s.Template, "template", "", "message template (required)")
	fs.StringVar(&f.s.Source, "source", "", "audience source registered (or staged) for the tenant (required)")
	fs.StringVar(&f.due, "due", "", "fixed due time, RFC 3339")
	fs.StringVar(&f.dueLocal, "due-local", "", "due at this wall-clock time in each recipient's zone, 2027-01-24T09:00")
	fs.IntVar(&f.daysBefore, "days-before", 0, "due this many days before each recipient's date column")
	fs.StringVar(&f.atLocal, "at-local", "", "with --days-before: at this local time of day in the recipient's zone, 09:00")
	fs.StringVar(&f.s.DefaultZone, "default-zone", "", "zone of audience rows without one (default UTC)")
	fs.StringVar(&f.deadline, "deadline", "", "business deadline, RFC 3339 (required)")
	fs.IntVar(&f.s.SliceSize, "slice-size", 0, fmt.Sprintf("audience rows per slice, %d-%d (0: the planner's --slice-size)",
		campaign.MinSliceSize, campaign.MaxSliceSize))
	fs.IntVar(&f.plannerSliceSize, "planner-slice-size", campaign.DefaultSliceSize,
		"the planner's --slice-size, for the admission of a campaign that sets none")
	fs.DurationVar(&f.s.Lease, "lease", 0, "how long one slice may hold the campaign (0: the schema's default, 30s)")
	fs.BoolVar(&f.s.Shadow, "shadow", false, "plan without creating sendable reminders, recording the count per slice")
	fs.BoolVar(&f.s.ShadowKeys, "shadow-keys", false, "with --shadow: record the audience keys too")
	fs.StringVar(&f.limits, "limits", "", "the workers' rate-limits file, for the delivery budget (empty: no limit)")
	fs.IntVar(&f.b.MaxAttempts, "max-attempts", 5, "the workers' --max-attempts, for the retry budget")
	fs.DurationVar(&f.b.BackoffBase, "backoff-base", time.Second, "the workers' --backoff-base")
	fs.DurationVar(&f.b.BackoffMax, "backoff-max", time.Hour, "the workers' --backoff-max")
	fs.Int64Var(&f.b.Audience, "audience", 0, "estimated audience rows, when this login may not count the source")
	fs.StringVar(&f.b.Override, "admit-anyway", "", "create even if admission refuses, recording this reason")
	config.CommandLineOnly(fs, "slice-size", "admit-anyway", "shadow", "shadow-keys", "audience")
	for _, name := range []string{"tenant", "name", "template", "source", "deadline"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

// spec checks the flags into f.s.
func (f *createFlags) spec(cmd *cobra.Command) error {
	d, err := time.Parse(time.RFC3339, f.deadline)
	if err != nil {
		return usage(fmt.Errorf("--deadline: %w", err))
	}
	f.s.Deadline = d
	rules := 0
	if f.due != "" {
		rules++
		t, err := time.Parse(time.RFC3339, f.due)
		if err != nil {
			return usage(fmt.Errorf("--due: %w", err))
		}
		f.s.DueAt = &t
	}
	if f.dueLocal != "" {
		rules++
		w, err := localtime.ParseWall(f.dueLocal)
		if err != nil {
			return usage(fmt.Errorf("--due-local: %w", err))
		}
		f.s.DueLocal = &w
	}
	if cmd.Flags().Changed("days-before") {
		rules++
		f.s.DaysBefore = &f.daysBefore
	}
	switch {
	case rules == 0:
		return usage(fmt.Errorf("give a due rule: --due, --due-local or --days-before"))
	case rules > 1:
		return usage(fmt.Errorf("give one due rule: --due, --due-local or --days-before, not more"))
	case f.atLocal != "" && f.s.DaysBefore == nil:
		return usage(fmt.Errorf("--at-local needs --days-before"))
	case f.s.ShadowKeys && !f.s.Shadow:
		return usage(fmt.Errorf("--shadow-keys needs --shadow"))
	}
	if f.atLocal != "" {
		c, err := time.Parse("15:04", f.atLocal)
		if err != nil {
			return usage(fmt.Errorf("--at-local %q: want a local time of day like 09:00", f.atLocal))
		}
		t := localtime.Clock(c.Hour(), c.Minute())
		f.s.AtLocal = &t
	}
	if f.s.DefaultZone != "" {
		if _, err := localtime.LoadZone(f.s.DefaultZone); err != nil {
			return usage(fmt.Errorf("--default-zone: %w", err))
		}
	}
	if f.s.SliceSize != 0 {
		if err := campaign.CheckSliceSize(f.s.SliceSize); err != nil {
			return usage(fmt.Errorf("--slice-size: %w", err))
		}
	}
	if err := campaign.CheckSliceSize(f.plannerSliceSize); err != nil {
		return usage(fmt.Errorf("--planner-slice-size: %w", err))
	}
	f.b.SliceSize = f.plannerSliceSize
	f.b.Limits, err = ratelimit.Load(f.limits)
	if err != nil {
		return usage(fmt.Errorf("--limits: %w", err))
	}
	f.b.LimitsFrom = f.limits
	if f.b.MaxAttempts < 1 {
		return usage(fmt.Errorf("--max-attempts %d: want at least 1", f.b.MaxAttempts))
	}
	return nil
}

func (f *createFlags) run(cmd *cobra.Command, connect connector) error {
	if err := f.spec(cmd); err != nil {
		return err
	}
	ctx, pool, done, err := connect(cmd)
	if err != nil {
		return err
	}
	defer done()
	out := cmd.OutOrStdout()
	if id, ok, err := campaign.Find(ctx, pool, f.s.Tenant, f.s.Name); err != nil {
		return err
	} else if ok {
		fmt.Fprintf(out, "campaign %d exists\n", id)
		return nil
	}
	adm, err := campaign.Assess(ctx, pool, f.s, f.b, time.Now())
	if err != nil {
		return err
	}
	if !adm.Admitted {
		return usage(fmt.Errorf("%w: campaign %q of tenant %q cannot be planned and delivered before its deadline:\n%s\n"+
			"(a later deadline, a larger --slice-size, a higher rate in the limits file, or --admit-anyway REASON)",
			campaign.ErrNotAdmitted, f.s.Name, f.s.Tenant, adm))
	}
	f.s.Admission = &adm
	id, created, err := campaign.Create(ctx, pool, f.s)
	if err != nil {
		return err
	}
	verb := "created"
	if !created {
		verb = "exists"
	}
	fmt.Fprintf(out, "campaign %d %s\n", id, verb)
	if created {
		fmt.Fprintf(cmd.ErrOrStderr(), "admission:\n%s\n", adm)
	}
	return nil
}

func campaignStageCmd(connect connector) *cobra.Command {
	var (
		source, tenant, file, format, channel, by string
		cols                                      = DefaultAudienceColumns
	)
	cmd := &cobra.Command{
		Use:   "stage",
		Short: "Stage a CSV or JSON Lines audience file into a source campaigns can name (idempotent per file)",
		Long: fmt.Sprintf(`stage loads an audience file into source --source of --tenant, replacing what it
held (refused while a campaign is still planning from it), in one transaction. Staging the same
file again changes nothing.

CSV: a header row naming the columns; the key and recipient columns are required, date
(YYYY-MM-DD) and zone (IANA name) optional, and every other column becomes a string of the
template's data. JSON Lines: {"key": "k1", "recipient": "...", "date": "2027-01-31",
"zone": "Europe/Stockholm", "data": {...}}; the key may be an integer.

A bad line (no key or recipient, an address that is not one for --channel, a bad date or zone,
a repeated key, a line over %d bytes, data over intake's limits) is recorded with its line,
key, field and reason, printed, and the good lines are staged. Limits: a file of at most %d
MiB and %d lines; a key of at most %d characters. Exit status 2 when any line was bad.`,
			MaxLineBytes, MaxAudienceFileBytes>>20, campaign.MaxStageRows, campaign.MaxStageKeyChars),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format == "" {
				switch strings.ToLower(filepath.Ext(file)) {
				case ".csv":
					format = "csv"
				case ".jsonl", ".ndjson":
					format = "jsonl"
				default:
					return usage(fmt.Errorf("-f %s: give --format csv or jsonl", file))
				}
			}
			if format != "csv" && format != "jsonl" {
				return usage(fmt.Errorf("--format %q: want csv or jsonl", format))
			}
			fh, digest, err := openAudience(file, fmt.Sprintf("%s %s %+v", format, channel, cols))
			if err != nil {
				return err
			}
			defer fh.Close()
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			res, err := campaign.Stage(ctx, pool, campaign.StageFile{Source: source, Tenant: tenant, Digest: digest,
				File: filepath.Base(file), By: by}, time.Now(), maxPrintedErrors,
				func(row func(campaign.StagedRow) error, bad func(campaign.StageError)) error {
					return ReadAudience(fh, format, cols, channel, row, bad)
				})
			if err != nil {
				return err
			}
			return printStaged(cmd, source, tenant, res)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&source, "source", "", "name of the staged source (required)")
	fs.StringVar(&tenant, "tenant", "", "tenant the source is for (required)")
	fs.StringVarP(&file, "file", "f", "", "the CSV or JSON Lines file (required)")
	fs.StringVar(&format, "format", "", "csv or jsonl (default: from the file's extension)")
	fs.StringVar(&channel, "channel", "email", "the channel whose addresses the recipients must be (email, sms, webhook)")
	fs.StringVar(&cols.Key, "key-column", cols.Key, "the audience key's column (unique, stable: the keyset cursor)")
	fs.StringVar(&cols.Recipient, "recipient-column", cols.Recipient, "the recipient's column")
	fs.StringVar(&cols.Date, "date-column", cols.Date, "the date column (for --days-before)")
	fs.StringVar(&cols.Zone, "zone-column", cols.Zone, "the zone column")
	fs.StringVar(&by, "actor", "nudgectl", "name recorded as who staged the file")
	for _, name := range []string{"source", "tenant", "file"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

// openAudience opens an audience file, checks its size, and returns it with
// the SHA-256 of its bytes and of how it is read.
func openAudience(path, how string) (*os.File, string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, "", usage(fmt.Errorf("-f: %w", err))
	}
	fail := func(err error) (*os.File, string, error) {
		fh.Close()
		return nil, "", err
	}
	st, err := fh.Stat()
	if err != nil {
		return fail(fmt.Errorf("-f: %w", err))
	}
	if !st.Mode().IsRegular() {
		return fail(usage(fmt.Errorf("-f %s: not a regular file (it is read twice: to know it, then to stage it)", path)))
	}
	if st.Size() > MaxAudienceFileBytes {
		return fail(usage(fmt.Errorf("-f %s: %d bytes, over the limit of %d MiB: split it into sources of its own",
			path, st.Size(), MaxAudienceFileBytes>>20)))
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(fh, MaxAudienceFileBytes+1)); err != nil {
		return fail(fmt.Errorf("-f: %w", err))
	}
	h.Write([]byte("\x00" + how))
	if _, err := fh.Seek(0, io.SeekStart); err != nil {
		return fail(fmt.Errorf("-f: %w", err))
	}
	return fh, hex.EncodeToString(h.Sum(nil)), nil
}

func printStaged(cmd *cobra.Command, source, tenant string, res campaign.StageResult) error {
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	for _, e := range res.Errors {
		fmt.Fprintln(errOut, e)
	}
	if more := res.Bad - int64(len(res.Errors)); more > 0 {
		fmt.Fprintf(errOut, "... and %d more bad lines (campaign_stage_errors, source %q)\n", more, source)
	}
	if res.Same {
		fmt.Fprintf(out, "source %s of tenant %s already holds this file: %d rows, %d bad lines; nothing changed\n",
			source, tenant, res.Rows, res.Bad)
	} else {
		fmt.Fprintf(out, "staged %d rows into source %s of tenant %s; %d bad lines\n", res.Rows, source, tenant, res.Bad)
	}
	if res.Bad > 0 {
		return &config.ExitError{Code: ExitUsage, Err: fmt.Errorf("%d bad lines not staged", res.Bad)}
	}
	return nil
}

func campaignCohortCmd(connect connector) *cobra.Command {
	var by string
	cmd := &cobra.Command{
		Use:   "cohort [set|add|remove TENANT...]",
		Short: "Show or change the tenants whose campaigns may be created and planned ('*': every tenant)",
		Long: `cohort lists the campaign cohort: the tenants whose campaigns may be created and planned,
'*' standing for every tenant (the default). Narrow it to enable campaigns for one cohort first:

  nudgectl campaign cohort set acme       # only acme
  nudgectl campaign cohort add globex     # and globex
  nudgectl campaign cohort set '*'        # everyone again

A campaign of a tenant outside the cohort is refused at create; one already planning waits,
unplanned and still 'planning', until its tenant is back (the planner drops its commands and
the cron does not nudge it).`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			if len(args) > 0 {
				tenants := args[1:]
				if len(tenants) == 0 {
					return usage(fmt.Errorf("cohort %s: name the tenants", args[0]))
				}
				switch args[0] {
				case "set":
					err = campaign.SetCohort(ctx, pool, tenants, by)
				case "add", "remove":
					err = campaign.ChangeCohort(ctx, pool, tenants, args[0] == "add", by)
				default:
					return usage(fmt.Errorf("cohort %q: want set, add or remove", args[0]))
				}
				if err != nil {
					return err
				}
			}
			ts, err := campaign.Cohort(ctx, pool)
			if err != nil {
				return err
			}
			if len(ts) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "campaign cohort: empty (no tenant may run campaigns)")
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "campaign cohort: %s\n", strings.Join(ts, " "))
			return nil
		},
	}
	cmd.Flags().StringVar(&by, "actor", "nudgectl", "name recorded as who added the tenants")
	return cmd
}

func campaignCompareCmd(connect connector) *cobra.Command {
	return &cobra.Command{
		Use:   "compare SHADOW_ID REAL_ID",
		Short: "Show a shadow campaign's counts per slice beside another campaign's (rows read, intents, bad rows)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			shadow, err := campaignID(args[0])
			if err != nil {
				return usage(err)
			}
			real, err := campaignID(args[1])
			if err != nil {
				return usage(err)
			}
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			cmp, err := campaign.CompareShadow(ctx, pool, shadow, real)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			differ := writeSliceComparisons(w, cmp, true)
			fmt.Fprintf(w, "%d slices, %d differ\n", len(cmp), differ)
			return nil
		},
	}
}

func counts(ns ...*int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = "-"
		if n != nil {
			parts[i] = strconv.Itoa(*n)
		}
	}
	return strings.Join(parts, "/")
}
