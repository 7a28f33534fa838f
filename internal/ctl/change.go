package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// The commands that change intent (issue 14): the operator's side of
// nudge_reschedule_to, nudge_update and nudge_cancel_prefix, the functions
// a web tier calls.

// changeFlags name one reminder and who changes it, and why.
type changeFlags struct {
	tenant, key, actor, reason string
}

func (c *changeFlags) register(f *pflag.FlagSet, defaultReason string) {
	f.StringVar(&c.tenant, "tenant", "", "tenant of the reminder (with --key)")
	f.StringVar(&c.key, "key", "", "logical key of the reminder (with --tenant)")
	f.StringVar(&c.actor, "actor", "nudgectl:"+os.Getenv("USER"), "who changes it, for the audit trail")
	f.StringVar(&c.reason, "reason", defaultReason, "why, for the audit trail")
}

// run looks the reminder up (an ID argument, or --tenant and --key), makes
// the change and prints what it did.
func (c *changeFlags) run(cmd *cobra.Command, connect connector, args []string, what string,
	change func(context.Context, *pgxpool.Pool, reminder.Reminder) (intake.Change, error)) error {
	ctx, pool, done, err := connect(cmd)
	if err != nil {
		return err
	}
	defer done()
	r, err := lookup(ctx, pool, args, c.tenant, c.key)
	if err != nil {
		return err
	}
	ch, err := change(ctx, pool, r)
	var ve *intake.ValidationError
	if errors.As(err, &ve) {
		return fmt.Errorf("--%s %s", strings.ReplaceAll(ve.Field, "_", "-"), ve.Reason)
	}
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	switch ch.Status {
	case intake.Changed:
		fmt.Fprintf(out, "reminder %d %s: pending again under a new fence (a queued message of the old version is discarded)\n",
			r.ID, what)
		return nil
	case intake.Unchanged:
		fmt.Fprintf(out, "reminder %d unchanged: it already is as asked\n", r.ID)
		return nil
	case intake.AlreadySending:
		return fmt.Errorf("reminder %d is being sent right now; its outcome will be recorded", r.ID)
	case intake.NotFound:
		return fmt.Errorf("reminder %d: %w", r.ID, intake.ErrNotFound)
	default:
		return fmt.Errorf("reminder %d already ended as %s", r.ID, ch.State)
	}
}

func rescheduleCmd(connect connector) *cobra.Command {
	var (
		c                       changeFlags
		dueAt, deadline, window string
	)
	cmd := &cobra.Command{
		Use:   "reschedule [ID]",
		Short: "Move a reminder that has not been sent to new due and deadline times (by ID, or --tenant and --key)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			now := time.Now()
			due, err := requiredWhen("due-at", dueAt, now)
			if err != nil {
				return err
			}
			dl, err := requiredWhen("deadline", deadline, now)
			if err != nil {
				return err
			}
			setWindow := cmd.Flags().Changed("window")
			var w *localtime.Window
			if setWindow && window != "policy" {
				parsed, err := localtime.ParseWindow(window)
				if err != nil {
					return usage(fmt.Errorf("--window: %w", err))
				}
				w = &parsed
			}
			return c.run(cmd, connect, args, "rescheduled",
				func(ctx context.Context, pool *pgxpool.Pool, r reminder.Reminder) (intake.Change, error) {
					if setWindow {
						return intake.RescheduleWindow(ctx, pool, r.Tenant, r.Key, due, dl, w, c.actor, c.reason)
					}
					return intake.RescheduleTo(ctx, pool, r.Tenant, r.Key, due, dl, c.actor, c.reason)
				})
		},
	}
	f := cmd.Flags()
	c.register(f, "rescheduled by operator")
	f.StringVar(&dueAt, "due-at", "", "new earliest send time (RFC 3339, now, now+2h; required)")
	f.StringVar(&deadline, "deadline", "", "new business deadline (RFC 3339, now, now+2h; required)")
	f.StringVar(&window, "window", "", `new send window in the recipient's zone ("mon-fri 08:00-21:00", "any"), or "policy" `+
		"for none of its own (the tenant's policy for the channel); absent: the window is kept")
	return cmd
}

func requiredWhen(flag, s string, now time.Time) (time.Time, error) {
	t, err := parseWhen(flag, s, now)
	if err != nil {
		return time.Time{}, err
	}
	if t == nil {
		return time.Time{}, fmt.Errorf("--%s is required", flag)
	}
	return *t, nil
}

func updateCmd(connect connector) *cobra.Command {
	var (
		c                   changeFlags
		recipient, template string
		dataStr             string
	)
	cmd := &cobra.Command{
		Use:   "update [ID]",
		Short: "Give a reminder that has not been sent new content: recipient, template, data (by ID, or --tenant and --key)",
		Long: `update records a new version of a reminder: the flags given replace the recipient, template or
data (a JSON object), the others are kept, and so are the channel, due time and deadline. The
reminder goes back to pending under a new fence: a message already queued for the old content is
discarded by the worker and the new content is sent instead. The same content again changes
nothing. A reminder that ended or is being sent is not changed.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			content := intake.Content{Recipient: recipient, Template: template}
			if dataStr != "" {
				content.Data = json.RawMessage(dataStr)
			}
			if content == (intake.Content{}) {
				return errors.New("nothing to update: give --recipient, --template or --data")
			}
			return c.run(cmd, connect, args, "updated",
				func(ctx context.Context, pool *pgxpool.Pool, r reminder.Reminder) (intake.Change, error) {
					return intake.Update(ctx, pool, r.Tenant, r.Key, content, c.actor, c.reason)
				})
		},
	}
	f := cmd.Flags()
	c.register(f, "updated by operator")
	f.StringVar(&recipient, "recipient", "", "new email address or E.164 phone number")
	f.StringVar(&template, "template", "", "new template name")
	f.StringVar(&dataStr, "data", "", "new template data, a JSON object (replaces the whole data)")
	return cmd
}

// prefixFlags select reminders by key prefix for cancel --key-prefix.
type prefixFlags struct {
	prefix string
	limit  int
	dryRun bool
}

func (p *prefixFlags) register(f *pflag.FlagSet) {
	f.StringVar(&p.prefix, "key-prefix", "",
		"cancel every open reminder of --tenant whose key starts with this (matched literally; needs --reason)")
	f.IntVar(&p.limit, "limit", 1000, fmt.Sprintf("with --key-prefix: cancel at most this many (1 to %d)", intake.MaxCancelPrefix))
	f.BoolVar(&p.dryRun, "dry-run", false, "with --key-prefix: count what would be canceled, change nothing")
}

// cancelPrefix is cancel --key-prefix: bulk, so the reason must be typed.
func (p *prefixFlags) cancel(cmd *cobra.Command, connect connector, args []string, tenant, actor, reason string) error {
	switch {
	case len(args) > 0 || cmd.Flags().Changed("key"):
		return errors.New("--key-prefix selects by prefix: give no ID and no --key")
	case tenant == "":
		return errors.New("--key-prefix needs --tenant")
	case !p.dryRun && !cmd.Flags().Changed("reason"):
		return errors.New("--key-prefix cancels many reminders: say why with --reason")
	}
	ctx, pool, done, err := connect(cmd)
	if err != nil {
		return err
	}
	defer done()
	out := cmd.OutOrStdout()
	if p.dryRun {
		n, err := intake.CountPrefix(ctx, pool, tenant, p.prefix)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "dry run: %d open reminders of %s with keys starting %q would be canceled (at most %d per run); %d being sent cannot be\n",
			n.Open, tenant, p.prefix, p.limit, n.Sending)
		return nil
	}
	cs, err := intake.CancelPrefix(ctx, pool, tenant, p.prefix, p.limit, actor, reason)
	var ve *intake.ValidationError
	if errors.As(err, &ve) {
		return fmt.Errorf("--%s %s", strings.ReplaceAll(ve.Field, "_", "-"), ve.Reason)
	}
	if err != nil {
		return err
	}
	printPrefixCancel(out, cs, p.limit)
	return nil
}

func printPrefixCancel(w io.Writer, cs []intake.Change, limit int) {
	canceled := 0
	for _, c := range cs {
		if c.Status == intake.Changed {
			canceled++
			fmt.Fprintf(w, "reminder %d %s canceled\n", c.ID, c.Key)
		} else {
			fmt.Fprintf(w, "reminder %d %s is being sent right now; its outcome will be recorded\n", c.ID, c.Key)
		}
	}
	fmt.Fprintf(w, "%d canceled, %d being sent\n", canceled, len(cs)-canceled)
	if canceled == limit {
		fmt.Fprintf(w, "the limit (%d) was reached: more may match; run again\n", limit)
	}
}
