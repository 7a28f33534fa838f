package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// brokerFlags are the broker settings of the commands that read queues.
type brokerFlags struct {
	amqpURL, prefix, signingKeys string
	maxMessages, pageSize        int
	wait                         time.Duration
}

func (b *brokerFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&b.amqpURL, "amqp-url", config.DefaultAMQPURL, "RabbitMQ connection URL")
	fs.StringVar(&b.prefix, "queue-prefix", broker.DefaultPrefix, "prefix of every exchange and queue name")
	fs.StringVar(&b.signingKeys, "signing-keys", "",
		"message signing keys (KID:SECRET,...): only a message whose signed body verifies names a reminder that "+
			"replay or expire act on; without them every message is shown unverified and can only be dropped")
	fs.IntVar(&b.maxMessages, "max-messages", 2*broker.DefaultDeadMaxLength,
		"refuse a dead-letter queue deeper than this (a read holds the whole queue: reading part of a quorum queue reorders it)")
	fs.DurationVar(&b.wait, "read-wait", 10*time.Second, "how long to wait for the messages the queue says it holds")
	fs.IntVar(&b.pageSize, "page-size", ops.MaxDLQPage, "messages a read's consumer holds; it takes the rest one by one")
	_ = fs.MarkHidden("page-size") // for tests: a deep queue without 65,535 messages
}

func (b *brokerFlags) dlq() (ops.DLQ, error) {
	d := ops.DLQ{
		URL: b.amqpURL, Topology: broker.Topology{Prefix: b.prefix}.WithDefaults(),
		MaxMessages: b.maxMessages, Wait: b.wait, PageSize: b.pageSize,
	}
	if b.signingKeys != "" {
		k, err := message.ParseKeys(b.signingKeys)
		if err != nil {
			return d, fmt.Errorf("--signing-keys: %w", err)
		}
		d.Keys = k
	}
	return d, nil
}

// decisionFlags are what every operator decision carries.
type decisionFlags struct {
	actor, reason, attempts string
	margin                  time.Duration
	dryRun                  bool
}

func (d *decisionFlags) register(fs *pflag.FlagSet, replay bool) {
	fs.StringVar(&d.actor, "actor", os.Getenv("USER"), "operator name recorded in every event (default $USER)")
	fs.StringVar(&d.reason, "reason", "", "why, recorded in every event (required)")
	fs.BoolVar(&d.dryRun, "dry-run", false, "print what would happen and change nothing")
	if replay {
		fs.StringVar(&d.attempts, "attempts", "",
			`attempt budget of replayed reminders (required): "reset" (attempts and republishes back to 0) or "keep"`)
		fs.DurationVar(&d.margin, "margin", ops.DefaultMargin,
			"refuse reminders with less than this left before their deadline")
	}
}

func (d *decisionFlags) decision(replay bool) (ops.Decision, error) {
	out := ops.Decision{Actor: d.actor, Reason: d.reason, Margin: d.margin, DryRun: d.dryRun}
	if replay {
		p, err := ops.ParseAttemptsPolicy(d.attempts)
		if err != nil {
			return out, err
		}
		out.Attempts = p
	}
	return out, nil
}

func parseChannel(s string) (reminder.Channel, error) {
	c := reminder.Channel(strings.ToLower(strings.TrimSpace(s)))
	if !c.Valid() {
		if s == "" {
			return "", usage(errors.New(`--channel is required: "email", "sms" or "webhook"`))
		}
		return "", fmt.Errorf(`--channel %q: want "email", "sms" or "webhook"`, s)
	}
	return c, nil
}

func dlqCmd(connect connector) *cobra.Command {
	var bf brokerFlags
	var channel string
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect and decide about dead letters (list, show, replay, expire)",
		Long: `dlq reads a channel's dead-letter queue without losing, reordering or re-counting its
messages: it consumes the whole queue exclusively without acknowledging, then closes, and the
broker returns every message in order. Each read raises the messages' x-delivery-count (shown
as READS); the receive count shown is the worker's own and does not change.

replay and expire decide about selected messages: the reminder's transition and an audit
record commit first, then the message is acknowledged; every other message goes back, in order.`,
	}
	pf := cmd.PersistentFlags()
	bf.register(pf)
	pf.StringVar(&channel, "channel", "", `"email", "sms" or "webhook" (required)`)

	// read opens the database and reads the queue with its rows loaded.
	read := func(cmd *cobra.Command) (*dlqSession, error) {
		ch, err := parseChannel(channel)
		if err != nil {
			return nil, err
		}
		d, err := bf.dlq()
		if err != nil {
			return nil, err
		}
		ctx, pool, done, err := connect(cmd)
		if err != nil {
			return nil, err
		}
		r, err := d.Read(ctx, ch)
		if err != nil {
			done()
			return nil, err
		}
		s := &dlqSession{ctx: ctx, pool: pool, read: r, close: func() { _ = r.Close(); done() }}
		if err := r.LoadRows(ctx, pool); err != nil {
			s.close()
			return nil, err
		}
		if r.Incomplete {
			fmt.Fprintf(cmd.ErrOrStderr(), "warning: %s said it held %d messages, %d arrived within --read-wait\n",
				r.Queue, r.Depth, len(r.Messages))
		}
		return s, nil
	}
	cmd.AddCommand(dlqListCmd(read), dlqShowCmd(read), dlqDecideCmd(read, ops.DLQReplay), dlqDecideCmd(read, ops.DLQExpire))
	return cmd
}

type dlqSession struct {
	ctx   context.Context
	pool  pg.Beginner
	read  *ops.DLQRead
	close func()
}

type dlqReader func(cmd *cobra.Command) (*dlqSession, error)

func dlqListCmd(read dlqReader) *cobra.Command {
	var asJSON bool
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List a dead-letter queue's messages in order, with their reminders (nothing is acknowledged)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := read(cmd)
			if err != nil {
				return err
			}
			defer s.close()
			now := time.Now()
			msgs := s.read.Messages
			if limit > 0 && len(msgs) > limit {
				msgs = msgs[:limit]
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"queue": s.read.Queue, "depth": s.read.Depth, "messages": msgs})
			}
			fmt.Fprintf(out, "%s: %d messages (read without acknowledging: order and receive counts kept)\n", s.read.Queue, len(s.read.Messages))
			if len(msgs) == 0 {
				return nil
			}
			printDeadLetters(out, msgs, now)
			if len(msgs) < len(s.read.Messages) {
				fmt.Fprintf(out, "… %d more (--limit)\n", len(s.read.Messages)-len(msgs))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().IntVar(&limit, "limit", 0, "print at most this many messages (the whole queue is read either way)")
	return cmd
}

func reminderCell(m *ops.DeadLetter) string {
	switch {
	case m.ReminderID == 0:
		return "-"
	case !m.Verified:
		return strconv.FormatInt(m.ReminderID, 10) + "?"
	}
	return strconv.FormatInt(m.ReminderID, 10)
}

func timeCell(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func leftCell(m *ops.DeadLetter, now time.Time) string {
	d, ok := m.TimeLeft(now)
	switch {
	case !ok:
		return "-"
	case d <= 0:
		return "passed"
	}
	return d.Round(time.Second).String()
}

func printDeadLetters(w io.Writer, msgs []*ops.DeadLetter, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POS\tREMINDER\tTENANT\tSTATE\tREASON\tRECEIVED\tFIRST SEEN\tDEADLINE\tLEFT\tREADS")
	unverified := false
	for _, m := range msgs {
		state, deadline := "-", m.Deadline
		if m.Row != nil {
			state, deadline = string(m.Row.State), &m.Row.Deadline
		} else if m.ReminderID != 0 && m.Verified {
			state = "(no row)"
		}
		unverified = unverified || (m.ReminderID != 0 && !m.Verified)
		tenant := m.Tenant
		if tenant == "" {
			tenant = "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\n", m.Position, reminderCell(m), tenant, state,
			oneLine(m.Reason, 60), m.ReceiveCount, timeCell(m.FirstSeen), timeCell(deadline), leftCell(m, now), m.Reads)
	}
	tw.Flush()
	if unverified {
		fmt.Fprintln(w, "ID?: named by an unverified message body; only `dlq expire` can drop it")
	}
}

func oneLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	if s == "" {
		return "-"
	}
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func dlqShowCmd(read dlqReader) *cobra.Command {
	var (
		id, msgID string
		pos       int
		asJSON    bool
	)
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Show dead letters in full: headers, body and reminder (by --id, --message or --position)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var rid int64
			if id != "" {
				var err error
				if rid, err = strconv.ParseInt(id, 10, 64); err != nil {
					return fmt.Errorf("--id %q: must be a reminder ID", id)
				}
			}
			if rid == 0 && msgID == "" && pos == 0 {
				return errors.New("name a dead letter: --id REMINDER, --message MESSAGE-ID or --position N")
			}
			s, err := read(cmd)
			if err != nil {
				return err
			}
			defer s.close()
			found := s.read.Find(rid, msgID, pos)
			if len(found) == 0 {
				return fmt.Errorf("%w in %s (%d messages)", errNoSuchMessage, s.read.Queue, len(s.read.Messages))
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(found)
			}
			now := time.Now()
			for i, m := range found {
				if i > 0 {
					fmt.Fprintln(out)
				}
				printDeadLetter(out, m, now)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&id, "id", "", "messages naming this reminder")
	f.StringVar(&msgID, "message", "", "the message with this message ID")
	f.IntVar(&pos, "position", 0, "the message at this position (1: the head)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printDeadLetter(w io.Writer, m *ops.DeadLetter, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "position\t%d\n", m.Position)
	fmt.Fprintf(tw, "message id\t%s\n", m.MessageID)
	verified := "verified"
	if !m.Verified {
		verified = "NOT verified: only `dlq expire` can drop it"
	}
	if m.ReminderID == 0 {
		fmt.Fprintf(tw, "reminder\tnone named\n")
	} else {
		fmt.Fprintf(tw, "reminder\t%d (%s)\n", m.ReminderID, verified)
	}
	fmt.Fprintf(tw, "reason\t%s\n", m.Reason)
	fmt.Fprintf(tw, "receive count\t%d\n", m.ReceiveCount)
	fmt.Fprintf(tw, "first seen\t%s\n", timeCell(m.FirstSeen))
	fmt.Fprintf(tw, "deadline (message)\t%s\n", timeCell(m.Deadline))
	fmt.Fprintf(tw, "time left\t%s\n", leftCell(m, now))
	fmt.Fprintf(tw, "reads from the DLQ\t%d\n", m.Reads)
	if r := m.Row; r != nil {
		fmt.Fprintf(tw, "row\t%s/%s, %s, fence %d, attempts %d, deadline %s\n", r.Tenant, r.Channel, r.State, r.Fence,
			r.Attempts, r.Deadline.UTC().Format(time.RFC3339))
		if r.Reason != "" {
			fmt.Fprintf(tw, "row reason\t%s\n", r.Reason)
		}
		if r.Purged {
			fmt.Fprintf(tw, "payload\tpurged by retention: cannot be replayed\n")
		}
	} else if m.ReminderID != 0 {
		fmt.Fprintf(tw, "row\tno such reminder\n")
	}
	keys := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, _ := json.Marshal(m.Headers[k])
		fmt.Fprintf(tw, "header %s\t%s\n", k, v)
	}
	body := m.Body
	if !utf8.ValidString(body) || strings.ContainsFunc(body, unicode.IsControl) {
		body = strconv.Quote(body) // never raw control bytes to a terminal
	}
	if m.BodyTruncated() {
		body += fmt.Sprintf(" … (the first %d of %d bytes)", len(m.Body), m.BodyBytes)
	}
	fmt.Fprintf(tw, "body\t%s\n", body)
	tw.Flush()
}

func dlqDecideCmd(read dlqReader, action ops.DLQAction) *cobra.Command {
	var (
		df         decisionFlags
		ids        []int64
		msgIDs     []string
		deadReason string
		all        bool
		asJSON     bool
	)
	short := map[ops.DLQAction]string{
		ops.DLQReplay: "Return the reminders of selected dead letters (quarantined, or waiting for that message) to work (deadline permitting) and drop their messages",
		ops.DLQExpire: "End the reminders of selected dead letters (quarantined, or waiting for that message) as expired and drop their messages (also drops messages naming no reminder)",
	}[action]
	cmd := &cobra.Command{
		Use:   string(action),
		Short: short,
		Long: short + `.

Select with --id (reminder IDs), --message (message IDs), --dead-reason (a substring of the dead
letter's reason) or --all. The reminder moves under a fence check (it must still be quarantined
with the fence that was read) with an event naming --actor and --reason; then its messages are
acknowledged. A reminder still enqueued or retrying at the dead letter's own fence is waiting for
that very message, the only copy of it (the broker dead-lettered it at its delivery limit): it
is decided about as a quarantined one is. A message whose reminder already moved on (replayed,
expired, delivered, or published again under a newer fence) is stale and is dropped too.
Everything else returns to the queue in order.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d, err := df.decision(action == ops.DLQReplay)
			if err != nil {
				return err
			}
			sel := ops.DLQSelector{IDs: ids, MessageIDs: msgIDs, ReasonContains: deadReason, All: all}
			s, err := read(cmd)
			if err != nil {
				return err
			}
			defer s.close()
			res, err := ops.DecideDLQ(s.ctx, s.pool, s.read, time.Now(), action, sel, d)
			if err != nil && len(res.Items) == 0 {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if jerr := enc.Encode(res); jerr != nil {
					return jerr
				}
				return err
			}
			printDecision(out, res, len(s.read.Messages))
			return err
		},
	}
	f := cmd.Flags()
	df.register(f, action == ops.DLQReplay)
	f.Int64SliceVar(&ids, "id", nil, "reminder IDs whose dead letters to select (repeatable, comma-separated)")
	f.StringSliceVar(&msgIDs, "message", nil, "message IDs to select (repeatable, comma-separated)")
	f.StringVar(&deadReason, "dead-reason", "", "select dead letters whose reason contains this text (case-insensitive)")
	f.BoolVar(&all, "all", false, "select every dead letter")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printDecision(w io.Writer, res ops.DLQResult, total int) {
	if res.DryRun {
		fmt.Fprintln(w, "dry run: nothing was changed or acknowledged")
	}
	if len(res.Items) == 0 {
		fmt.Fprintf(w, "no dead letter in %s matches (%d messages)\n", res.Queue, total)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POS\tMESSAGE\tREMINDER\tVERDICT\tDETAIL")
	for _, it := range res.Items {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", it.Message.Position, it.Message.MessageID, reminderCell(it.Message),
			it.Verdict, it.Detail)
	}
	tw.Flush()
	var parts []string
	for _, v := range []ops.Verdict{ops.VerdictReplay, ops.VerdictExpire, ops.VerdictDrop, ops.VerdictRefusedDeadline,
		ops.VerdictRefusedPurged, ops.VerdictRefusedNoReminder, ops.VerdictMovedOn} {
		if n := res.Counts[v]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", v, n))
		}
	}
	verb := "acknowledged"
	if res.DryRun {
		verb = "would be acknowledged"
	}
	fmt.Fprintf(w, "dlq %s: %s; %d messages %s, %d left in %s\n", res.Action, strings.Join(parts, ", "),
		res.Acked(), verb, total-res.Acked(), res.Queue)
}
