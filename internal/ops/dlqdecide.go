package ops

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// DLQAction is what an operator does with selected dead letters.
type DLQAction string

const (
	// DLQReplay returns quarantined reminders, and enqueued or retrying ones
	// whose only message is the dead letter (WaitsFor), to pending (the
	// dispatcher publishes them again) and acknowledges their messages.
	DLQReplay DLQAction = "replay"
	// DLQExpire ends quarantined reminders (and those WaitsFor) as expired and acknowledges
	// their messages; it is also the only way to drop a message that names
	// no (verifiable, existing) reminder.
	DLQExpire DLQAction = "expire"
)

// Verdict is what a decision did (or, dry, would do) with one dead letter.
type Verdict string

const (
	// VerdictReplay: the reminder is back to pending; the message is acknowledged.
	VerdictReplay Verdict = "replay"
	// VerdictExpire: the reminder is expired; the message is acknowledged.
	VerdictExpire Verdict = "expire"
	// VerdictDrop: the message is acknowledged and nothing else changes: it
	// names no verifiable reminder or one that no longer exists (expire
	// only), or its reminder already moved on (replayed, expired, delivered,
	// or published again under a newer fence) and the message is stale.
	// Recorded in operator_audit.
	VerdictDrop Verdict = "drop"
	// VerdictRefusedDeadline: replay refused, the deadline passed or is
	// within the margin; the message stays (expire it).
	VerdictRefusedDeadline Verdict = "refused: deadline"
	// VerdictRefusedPurged: replay refused, the payload was purged.
	VerdictRefusedPurged Verdict = "refused: payload purged"
	// VerdictRefusedNoReminder: replay refused, the message names no
	// verifiable, existing reminder; the message stays (expire drops it).
	VerdictRefusedNoReminder Verdict = "refused: no reminder"
	// VerdictMovedOn: the reminder changed between the read and the write;
	// nothing was done and the message stays. Run the command again.
	VerdictMovedOn Verdict = "moved on"
)

// Acked reports whether the verdict acknowledges the message.
func (v Verdict) Acked() bool { return v == VerdictReplay || v == VerdictExpire || v == VerdictDrop }

// DLQSelector picks dead letters: a message is selected when All is set or
// it matches any of the given IDs, message IDs or reason substring.
type DLQSelector struct {
	IDs            []int64
	MessageIDs     []string
	ReasonContains string
	All            bool
}

func (s DLQSelector) validate() error {
	if !s.All && len(s.IDs) == 0 && len(s.MessageIDs) == 0 && s.ReasonContains == "" {
		return ErrNoSelection
	}
	return nil
}

func (s DLQSelector) match(m *DeadLetter) bool {
	return s.All ||
		(m.ReminderID > 0 && slices.Contains(s.IDs, m.ReminderID)) ||
		(m.MessageID != "" && slices.Contains(s.MessageIDs, m.MessageID)) ||
		(s.ReasonContains != "" && strings.Contains(strings.ToLower(m.Reason), strings.ToLower(s.ReasonContains)))
}

// DLQItem is one selected dead letter and its verdict.
type DLQItem struct {
	Message *DeadLetter `json:"message"`
	Verdict Verdict     `json:"verdict"`
	// Detail explains the verdict.
	Detail string `json:"detail"`
}

// DLQResult says what a decision did (or, dry, would do).
type DLQResult struct {
	Action DLQAction `json:"action"`
	DryRun bool      `json:"dry_run"`
	// Items are the selected messages in queue order.
	Items  []DLQItem        `json:"items"`
	Counts map[Verdict]int  `json:"counts"`
	Queue  string           `json:"queue"`
	Chan   reminder.Channel `json:"channel"`
}

// Acked counts the messages acknowledged (or, dry, that would be).
func (r DLQResult) Acked() int {
	n := 0
	for v, c := range r.Counts {
		if v.Acked() {
			n += c
		}
	}
	return n
}

// DecideDLQ applies action to the selected messages of read (whose rows must
// be loaded): the reminder transitions and the audit rows commit in one
// transaction, and only then are the messages acknowledged. Messages not
// acknowledged return to the queue, in order, when the read is closed.
func DecideDLQ(ctx context.Context, db pg.Beginner, read *DLQRead, now time.Time, action DLQAction, sel DLQSelector, d Decision) (DLQResult, error) {
	res := DLQResult{Action: action, DryRun: d.DryRun, Counts: map[Verdict]int{}, Queue: read.Queue, Chan: read.Channel}
	if action != DLQReplay && action != DLQExpire {
		return res, fmt.Errorf("unknown dead-letter action %q", action)
	}
	if err := sel.validate(); err != nil {
		return res, err
	}
	if read.Incomplete {
		return res, fmt.Errorf("only %d of the %d messages of %s arrived: decide on a complete read (try again)",
			len(read.Messages), read.Depth, read.Queue)
	}
	if err := d.validate(action == DLQReplay); err != nil {
		return res, err
	}
	if action == DLQExpire {
		d.Attempts = "" // not part of an expiry's reason
	}

	// Classify from what was read.
	fences := map[int64]int64{}
	for _, m := range read.Messages {
		if !sel.match(m) {
			continue
		}
		it := DLQItem{Message: m}
		row := m.Row
		switch {
		case m.ReminderID == 0 || !m.Verified:
			it.Verdict, it.Detail = dropOrRefuse(action, "the message names no verifiable reminder")
		case row == nil:
			it.Verdict, it.Detail = dropOrRefuse(action, fmt.Sprintf("reminder %d does not exist", m.ReminderID))
		case !WaitsFor(row, m):
			it.Verdict = VerdictDrop
			it.Detail = fmt.Sprintf("stale: reminder %d is already %s", row.ID, row.State)
			if row.State == reminder.Enqueued || row.State == reminder.Retrying {
				it.Detail = fmt.Sprintf("stale: reminder %d is %s at fence %d, a newer copy than this message's (fence %d)",
					row.ID, row.State, row.Fence, m.Fence)
			}
		case action == DLQExpire:
			it.Verdict, it.Detail = VerdictExpire, fmt.Sprintf("reminder %d %s → expired%s", row.ID, row.State, onlyCopy(row))
			fences[row.ID] = row.Fence
		case row.Purged:
			it.Verdict, it.Detail = VerdictRefusedPurged, fmt.Sprintf("reminder %d has no payload left", row.ID)
		case !row.Deadline.After(now.Add(d.Margin)):
			it.Verdict = VerdictRefusedDeadline
			it.Detail = fmt.Sprintf("reminder %d has %s left before its deadline, the margin is %s (expire it instead)%s",
				row.ID, row.Deadline.Sub(now).Round(time.Second), d.Margin, onlyCopy(row))
		default:
			it.Verdict = VerdictReplay
			it.Detail = fmt.Sprintf("reminder %d %s → pending (attempts %s)%s", row.ID, row.State, d.Attempts, onlyCopy(row))
			fences[row.ID] = row.Fence
		}
		res.Items = append(res.Items, it)
	}
	if d.DryRun || len(res.Items) == 0 {
		res.tally()
		return res, nil
	}

	tx, err := db.Begin(ctx)
	if err != nil {
		return res, fmt.Errorf("deciding about dead letters: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	moved := map[int64]bool{}
	if len(fences) > 0 {
		ids, fs := make([]int64, 0, len(fences)), make([]int64, 0, len(fences))
		for id, f := range fences {
			ids, fs = append(ids, id), append(fs, f)
		}
		name, prefix := "DLQReplay", ReasonPrefixDLQReplay
		if action == DLQExpire {
			name, prefix = "DLQExpire", ReasonPrefixDLQExpire
		}
		rows, err := tx.Query(ctx, query(name), pgx.NamedArgs{
			"ids": ids, "fences": fs, "now": now, "min_deadline": now.Add(d.Margin),
			"reset_attempts": d.Attempts == ResetAttempts, "actor": d.Actor, "reason": d.eventReason(prefix),
		})
		if err != nil {
			return res, fmt.Errorf("deciding about dead letters: %w", err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return res, fmt.Errorf("deciding about dead letters: %w", err)
		}
		for _, id := range got {
			moved[id] = true
		}
	}
	var ack []*DeadLetter
	var actions, msgIDs []string
	var remIDs []int64
	var details [][]byte
	var dropped []int64 // verified, existing reminders whose stale dead letter is dropped
	var dropDetails []string
	for i := range res.Items {
		it := &res.Items[i]
		if (it.Verdict == VerdictReplay || it.Verdict == VerdictExpire) && !moved[it.Message.ReminderID] {
			it.Verdict = VerdictMovedOn
			it.Detail = fmt.Sprintf("reminder %d changed since it was read; nothing done, message kept", it.Message.ReminderID)
			continue
		}
		if !it.Verdict.Acked() {
			continue
		}
		ack = append(ack, it.Message)
		actions = append(actions, "dlq."+strings.SplitN(string(it.Verdict), ":", 2)[0])
		msgIDs = append(msgIDs, pgText(it.Message.MessageID))
		remIDs = append(remIDs, it.Message.ReminderID)
		details = append(details, auditDetail(it))
		if it.Verdict == VerdictDrop && it.Message.Verified && it.Message.Row != nil {
			dropped, dropDetails = append(dropped, it.Message.ReminderID), append(dropDetails, it.Detail)
		}
	}
	if len(ack) > 0 {
		if _, err := tx.Exec(ctx, query("Audit"), pgx.NamedArgs{
			"now": now, "actor": d.Actor, "channel": string(read.Channel), "reason": d.eventReason("dlq " + string(action) + ": "),
			"actions": actions, "reminder_ids": remIDs, "message_ids": msgIDs, "details": details,
		}); err != nil {
			return res, fmt.Errorf("recording the audit trail: %w", err)
		}
	}
	if len(dropped) > 0 {
		// The audit has every drop; the reminder's own timeline (nudgectl
		// show) has those of its verified dead letters, as notes.
		if _, err := tx.Exec(ctx, query("NoteDropped"), pgx.NamedArgs{
			"now": now, "actor": d.Actor, "reason": d.eventReason("dlq " + string(action) + ": "),
			"ids": dropped, "details": dropDetails,
		}); err != nil {
			return res, fmt.Errorf("noting dropped dead letters: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("deciding about dead letters: %w", err)
	}
	res.tally()
	// Committed: a failed ack only leaves a message whose reminder moved on,
	// which the next decision drops as stale.
	if err := read.ack(ack); err != nil {
		return res, fmt.Errorf("decisions are recorded, but %w; the messages stay and will be dropped as stale next time", err)
	}
	return res, nil
}

// WaitsFor reports whether reminder row is still waiting for dead letter m,
// so that a decision about m is one about row: row is quarantined (its
// message was dead-lettered on purpose), or it is enqueued or retrying at
// the fence of m's verified body. In the second case m is the only copy of
// its message (a republish or replay would have raised the fence): the
// broker dead-lettered it (x-delivery-limit) or a worker did without
// recording anything, and the reminder would wait for the reconciler's
// overdue republish. Acknowledging such a message as stale stranded its
// reminder (issue 17).
func WaitsFor(row *DeadLetterRow, m *DeadLetter) bool {
	switch row.State {
	case reminder.Quarantined:
		return true
	case reminder.Enqueued, reminder.Retrying:
		return m.Verified && m.Fence == row.Fence
	}
	return false
}

// onlyCopy explains a decision about a reminder that waited for its dead letter.
func onlyCopy(row *DeadLetterRow) string {
	if row.State == reminder.Quarantined {
		return ""
	}
	return fmt.Sprintf("; it was %s waiting for this message, the only copy of it", row.State)
}

func dropOrRefuse(action DLQAction, why string) (Verdict, string) {
	if action == DLQExpire {
		return VerdictDrop, why + "; message dropped"
	}
	return VerdictRefusedNoReminder, why + "; only expire can drop it"
}

func (r *DLQResult) tally() {
	for _, it := range r.Items {
		r.Counts[it.Verdict]++
	}
}

func auditDetail(it *DLQItem) []byte {
	m := it.Message
	det := map[string]any{
		"verdict": it.Verdict, "detail": it.Detail, "dead_reason": m.Reason,
		"receive_count": m.ReceiveCount, "position": m.Position, "verified": m.Verified,
	}
	if m.FirstSeen != nil {
		det["first_seen"] = m.FirstSeen.UTC()
	}
	if m.Deadline != nil {
		det["deadline"] = m.Deadline.UTC()
	}
	if m.Row != nil {
		det["state"] = m.Row.State
		det["fence"] = m.Row.Fence
	}
	if m.ReminderID == 0 || !m.Verified {
		auditBody(det, m) // nothing else records what was dropped
	}
	for k, v := range det {
		if s, ok := v.(string); ok {
			det[k] = pgText(s)
		}
	}
	b, _ := json.Marshal(det)
	return b
}

// MaxAuditBody bounds the body an operator_audit row keeps of a dropped
// message: enough to recognise it, never the whole of a junk body.
const MaxAuditBody = 2 << 10

// auditBody records m's body in det: at most MaxAuditBody bytes of it, as
// text when it is text PostgreSQL can store, else base64, with its length
// and whether it was cut.
func auditBody(det map[string]any, m *DeadLetter) {
	body := m.Body
	if len(body) > MaxAuditBody {
		body = body[:MaxAuditBody]
		// Not in the middle of a character: drop the start of one cut off.
		for range utf8.UTFMax - 1 {
			if r, size := utf8.DecodeLastRuneInString(body); r != utf8.RuneError || size != 1 {
				break
			}
			body = body[:len(body)-1]
		}
	}
	if utf8.ValidString(body) && !strings.ContainsRune(body, 0) {
		det["body"] = body
	} else {
		det["body_base64"] = base64.StdEncoding.EncodeToString([]byte(body))
	}
	det["body_bytes"] = m.BodyBytes
	if len(body) < m.BodyBytes {
		det["body_truncated"] = true
	}
}

// pgText makes s storable in PostgreSQL text and jsonb: invalid UTF-8 and
// NUL characters (which a message ID or header may hold) become U+FFFD.
func pgText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}
