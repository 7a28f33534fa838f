package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// AttemptsPolicy says what a replay does to a reminder's attempt budget.
type AttemptsPolicy string

const (
	// ResetAttempts gives the reminder a fresh budget: attempts and
	// republishes go back to zero, so it gets the worker's full --max-attempts
	// and the reconciler's republish bound again.
	ResetAttempts AttemptsPolicy = "reset"
	// KeepAttempts keeps both counters: a reminder that had used its budget
	// fails at its next retryable error, one the reconciler had to republish
	// repeatedly is quarantined at the next loss.
	KeepAttempts AttemptsPolicy = "keep"
)

// ParseAttemptsPolicy reads --attempts.
func ParseAttemptsPolicy(s string) (AttemptsPolicy, error) {
	switch p := AttemptsPolicy(strings.ToLower(strings.TrimSpace(s))); p {
	case ResetAttempts, KeepAttempts:
		return p, nil
	case "":
		return "", errors.New(`--attempts is required: "reset" (a fresh attempt budget) or "keep" (the budget left)`)
	}
	return "", fmt.Errorf(`--attempts %q: want "reset" or "keep"`, s)
}

// Decision is what every operator action carries: who, why, and whether to
// only say what would happen.
type Decision struct {
	// Actor is the operator's name, recorded in every event. Required.
	Actor string
	// Reason is why, recorded in every event (prefixed with the tool). Required.
	Reason string
	// Attempts is the attempt-budget policy of a replay. Required to replay.
	Attempts AttemptsPolicy
	// Margin is how much time before its deadline a replayed reminder must
	// have left; one closer is refused. Zero value: no margin beyond "before
	// the deadline" (DefaultMargin is what nudgectl uses).
	Margin time.Duration
	// DryRun reports what would happen and changes nothing.
	DryRun bool
}

// DefaultMargin is the time a replayed reminder must have left before its
// deadline: enough for a dispatcher run, a queue wait and a send.
const DefaultMargin = 5 * time.Minute

func (d Decision) validate(replay bool) error {
	if strings.TrimSpace(d.Reason) == "" {
		return ErrNoReason
	}
	if strings.TrimSpace(d.Actor) == "" {
		return ErrNoActor
	}
	if d.Margin < 0 {
		return fmt.Errorf("--margin %s: must not be negative", d.Margin)
	}
	if replay {
		if _, err := ParseAttemptsPolicy(string(d.Attempts)); err != nil {
			return err
		}
	}
	return nil
}

func (d Decision) eventReason(prefix string) string {
	r := prefix + strings.TrimSpace(d.Reason)
	switch d.Attempts {
	case ResetAttempts:
		r += " [attempts reset]"
	case KeepAttempts:
		r += " [attempts kept]"
	}
	return r
}

// ReplayableStates are the states a controlled replay may select. The others
// never: delivered, canceled and expired are final decisions, sending has an
// attempt in flight (its outcome will be recorded), pending already waits
// for the dispatcher.
var ReplayableStates = []reminder.State{
	reminder.Failed, reminder.Quarantined, reminder.Leased, reminder.Enqueued, reminder.Retrying,
}

// DefaultReplayStates is what a replay selects unless told otherwise: every
// replayable state. Failed and quarantined reminders are always candidates;
// leased, enqueued and retrying ones only once stuck (StuckFor).
var DefaultReplayStates = ReplayableStates

// DefaultStuckFor is how long a leased, enqueued or retrying reminder must
// have been waiting past its time before a replay selects it: the
// reconciler's default --overdue, so a replay never races a healthy queue.
const DefaultStuckFor = 10 * time.Minute

// DefaultReplayBatch bounds each replay statement.
const DefaultReplayBatch = 1000

// ReplaySelection names the reminders a replay considers. At least IDs or a
// due-time bound is required; everything given must match.
type ReplaySelection struct {
	// IDs selects these reminders.
	IDs []int64
	// DueFrom and DueTo bound due_at: DueFrom <= due_at < DueTo. Nil: unbounded.
	DueFrom, DueTo *time.Time
	// Channel and Tenant filter when set.
	Channel reminder.Channel
	Tenant  string
	// States filter; they must be among ReplayableStates. Zero value: DefaultReplayStates.
	States []reminder.State
	// StuckFor: a leased reminder is selected once its lease expired this
	// long ago, an enqueued one once enqueued this long ago, a retrying one
	// once its next attempt is this much overdue. Zero value: immediately.
	StuckFor time.Duration
	// Batch bounds each statement. Zero value: DefaultReplayBatch.
	Batch int
}

// ReplayResult says what a replay did (or, dry, would do).
type ReplayResult struct {
	DryRun bool `json:"dry_run"`
	// Matched reminders were selected; each is counted in exactly one of
	// Replayed, RefusedDeadline, RefusedPurged and MovedOn.
	Matched  int                    `json:"matched"`
	ByState  map[reminder.State]int `json:"by_state"`
	Replayed int                    `json:"replayed"`
	// RefusedDeadline: past or within the margin of the deadline.
	RefusedDeadline int `json:"refused_deadline"`
	// RefusedPurged: the retention pass removed the payload.
	RefusedPurged int `json:"refused_purged"`
	// MovedOn changed between the read and the write (a worker or the
	// reconciler got there first); a second run decides about them again.
	MovedOn int `json:"moved_on"`
	// Refused lists the refused IDs (the first 100).
	Refused []int64 `json:"refused,omitempty"`
	// NotSelected explains named IDs that were not candidates: their state,
	// or "" when there is no such reminder.
	NotSelected map[int64]reminder.State `json:"not_selected,omitempty"`
}

const maxListed = 100

func (sel ReplaySelection) validate() error {
	if len(sel.IDs) == 0 && sel.DueFrom == nil && sel.DueTo == nil {
		return errors.New("name what to replay: --id, or a due-time window with --from and/or --to")
	}
	if sel.DueFrom != nil && sel.DueTo != nil && !sel.DueFrom.Before(*sel.DueTo) {
		return fmt.Errorf("--from %s is not before --to %s", sel.DueFrom.Format(time.RFC3339), sel.DueTo.Format(time.RFC3339))
	}
	if sel.Channel != "" && !sel.Channel.Valid() {
		return fmt.Errorf(`--channel %q: want "email", "sms" or "webhook"`, sel.Channel)
	}
	for _, s := range sel.States {
		if !slices.Contains(ReplayableStates, s) {
			return fmt.Errorf("--state %s: a replay selects only %s (delivered, canceled and expired are final, "+
				"sending is in flight, pending already waits for the dispatcher)", s, joinStates(ReplayableStates))
		}
	}
	if sel.StuckFor < 0 {
		return fmt.Errorf("--stuck-for %s: must not be negative", sel.StuckFor)
	}
	return nil
}

func joinStates(ss []reminder.State) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return strings.Join(out, ", ")
}

// Replay moves the selected reminders back to pending under a new fence, in
// batches of one statement each, with an event naming d.Actor and d.Reason.
// The dispatcher publishes them on its next run; any message still queued
// for them is superseded. It is idempotent: a replayed reminder is pending
// (untouched by a second run) until the dispatcher takes it, and is then
// leased or enqueued under a fresh lease, not stuck; a delivered one is never
// selected. With d.DryRun it writes nothing and reports what it would do.
func Replay(ctx context.Context, q pg.Querier, now time.Time, sel ReplaySelection, d Decision) (ReplayResult, error) {
	res := ReplayResult{DryRun: d.DryRun, ByState: map[reminder.State]int{}}
	if err := sel.validate(); err != nil {
		return res, err
	}
	if err := d.validate(true); err != nil {
		return res, err
	}
	states := sel.States
	if len(states) == 0 {
		states = DefaultReplayStates
	}
	batch := sel.Batch
	if batch <= 0 {
		batch = DefaultReplayBatch
	}
	ids := sel.IDs
	if ids == nil {
		ids = []int64{}
	}
	seen := map[int64]bool{}
	args := pgx.NamedArgs{
		"now": now, "min_deadline": now.Add(d.Margin), "ids": ids,
		"due_from": sel.DueFrom, "due_to": sel.DueTo,
		"channel": string(sel.Channel), "tenant": sel.Tenant, "states": stateStrings(states),
		"stuck_before": now.Add(-sel.StuckFor), "limit": batch,
		"reset_attempts": d.Attempts == ResetAttempts, "apply": !d.DryRun,
		"actor": d.Actor, "reason": d.eventReason(ReasonPrefixReplay),
	}
	var after int64
	for {
		args["after"] = after
		n, last, err := replayBatch(ctx, q, args, &res, seen)
		if err != nil {
			return res, err
		}
		after = last
		if n < batch {
			break
		}
	}
	if len(sel.IDs) > 0 {
		if err := explainNotSelected(ctx, q, sel.IDs, seen, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// replayBatch runs one Replay statement and tallies its verdicts. It returns
// how many reminders the batch held and the last id, the next cursor.
func replayBatch(ctx context.Context, q pg.Querier, args pgx.NamedArgs, res *ReplayResult, seen map[int64]bool) (int, int64, error) {
	rows, err := q.Query(ctx, query("Replay"), args)
	if err != nil {
		return 0, 0, fmt.Errorf("replaying reminders: %w", err)
	}
	var (
		n       int
		last    int64
		id      int64
		state   reminder.State
		verdict string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &state, &verdict}, func() error {
		n++
		last = id
		seen[id] = true
		res.Matched++
		res.ByState[state]++
		switch verdict {
		case "replay":
			res.Replayed++
		case "refused_deadline", "refused_purged":
			if verdict == "refused_deadline" {
				res.RefusedDeadline++
			} else {
				res.RefusedPurged++
			}
			if len(res.Refused) < maxListed {
				res.Refused = append(res.Refused, id)
			}
		case "moved_on":
			res.MovedOn++
		default:
			return fmt.Errorf("replaying reminders: unexpected verdict %q for reminder %d", verdict, id)
		}
		return nil
	})
	if err != nil {
		return n, last, fmt.Errorf("replaying reminders: %w", err)
	}
	return n, last, nil
}

// explainNotSelected records the state of each named ID the replay did not
// select ("" for an ID with no reminder).
func explainNotSelected(ctx context.Context, q pg.Querier, ids []int64, seen map[int64]bool, res *ReplayResult) error {
	var missing []int64
	for _, id := range ids {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	res.NotSelected = map[int64]reminder.State{}
	for _, id := range missing {
		res.NotSelected[id] = ""
	}
	rows, err := q.Query(ctx, query("ReminderStates"), pgx.NamedArgs{"ids": missing})
	if err != nil {
		return fmt.Errorf("reading reminder states: %w", err)
	}
	var (
		id    int64
		state reminder.State
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &state}, func() error {
		res.NotSelected[id] = state
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading reminder states: %w", err)
	}
	return nil
}

func stateStrings(ss []reminder.State) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}
