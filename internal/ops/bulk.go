package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// BulkAction is what an operator does to every reminder a Filter selects.
// Each reuses the fenced statement of the single-reminder decision: cancel
// is nudge_cancel (as `nudgectl cancel`), replay is Replay (as `nudgectl
// replay --id`), expire is the dead-letter expiry (DLQExpire), which ends
// only quarantined reminders: every other open reminder is either still
// being worked (cancel it instead) or already owed an expiry by the
// reconciler at its deadline.
type BulkAction string

// The bulk actions.
const (
	BulkCancel BulkAction = "cancel"
	BulkReplay BulkAction = "replay"
	BulkExpire BulkAction = "expire"
)

// ParseBulkAction reads an action's name.
func ParseBulkAction(s string) (BulkAction, error) {
	switch a := BulkAction(s); a {
	case BulkCancel, BulkReplay, BulkExpire:
		return a, nil
	}
	return "", fmt.Errorf(`unknown bulk action %q: want "cancel", "replay" or "expire"`, s)
}

// Errors of bulk actions.
var (
	// ErrBulkNoFilter: a bulk action on every reminder is never meant.
	ErrBulkNoFilter = errors.New("a bulk action needs a filter: name a tenant, state, channel, key prefix, time range, --late or --reason")
	// ErrBulkTooLarge: the filter selects more reminders than BulkOptions.Max.
	ErrBulkTooLarge = errors.New("the filter selects more reminders than a bulk action may change at once")
)

// DefaultBulkMax bounds a bulk action unless told otherwise.
const DefaultBulkMax = 10000

// BulkOptions tune a bulk action.
type BulkOptions struct {
	// Max refuses a selection of more reminders (ErrBulkTooLarge). Zero
	// value: DefaultBulkMax.
	Max int
	// StuckFor is the replay's: how long a leased, enqueued or retrying
	// reminder must be overdue to be replayed. Zero value: DefaultStuckFor.
	StuckFor time.Duration
	// Progress, when set, is called after each reminder with how many are
	// done of how many were selected.
	Progress func(done, total int)
}

// BulkResult says what a bulk action did (or, dry, would do).
type BulkResult struct {
	Action BulkAction `json:"action"`
	DryRun bool       `json:"dry_run"`
	// Selected is how many reminders the filter selected, ByState by state.
	Selected int                    `json:"selected"`
	ByState  map[reminder.State]int `json:"by_state"`
	// Changed is how many were (or, dry, would be) cancelled, replayed or
	// expired; each has an event and an operator_audit row (not in a dry run).
	Changed int `json:"changed"`
	// Skipped counts the others by why: the state they are in, a replay's
	// refusal, or "moved on" (changed between the read and the write).
	Skipped map[string]int `json:"skipped,omitempty"`
}

// Bulk applies action to every reminder f selects, one fenced statement
// and one audit row per reminder, each in a transaction of its own (so an
// interrupted run leaves every decision it took recorded, and a second run
// skips them). It refuses an empty filter and a selection larger than
// opt.Max. With d.DryRun it changes nothing and says what it would do.
func Bulk(ctx context.Context, db pg.Beginner, now time.Time, action BulkAction, f Filter, d Decision, opt BulkOptions) (BulkResult, error) {
	res := BulkResult{Action: action, DryRun: d.DryRun, ByState: map[reminder.State]int{}, Skipped: map[string]int{}}
	if _, err := ParseBulkAction(string(action)); err != nil {
		return res, err
	}
	if err := f.Validate(); err != nil {
		return res, err
	}
	if f.Empty() {
		return res, ErrBulkNoFilter
	}
	if err := d.validate(action == BulkReplay); err != nil {
		return res, err
	}
	if action != BulkReplay {
		d.Attempts = "" // not part of a cancellation's or an expiry's reason
	}
	maxN := opt.Max
	if maxN <= 0 {
		maxN = DefaultBulkMax
	}
	stuck := opt.StuckFor
	if stuck <= 0 {
		stuck = DefaultStuckFor
	}
	items, err := selectAll(ctx, db, now, f, maxN)
	if err != nil {
		return res, err
	}
	res.Selected = len(items)
	for _, it := range items {
		res.ByState[it.State]++
	}
	if len(items) == 0 {
		return res, nil
	}
	if d.DryRun {
		return res, bulkDryRun(ctx, db, now, action, items, d, stuck, &res)
	}
	filter, _ := json.Marshal(f)
	for i, it := range items {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("bulk %s stopped after %d of %d: %w", action, i, len(items), err)
		}
		verdict, err := bulkOne(ctx, db, now, action, it, d, stuck, filter)
		if err != nil {
			return res, fmt.Errorf("bulk %s of reminder %d (%d of %d done): %w", action, it.ID, i, len(items), err)
		}
		if verdict == "" {
			res.Changed++
		} else {
			res.Skipped[verdict]++
		}
		if opt.Progress != nil {
			opt.Progress(i+1, len(items))
		}
	}
	return res, nil
}

// selectAll reads every reminder f selects (at most maxN, else ErrBulkTooLarge).
func selectAll(ctx context.Context, q pg.Querier, now time.Time, f Filter, maxN int) ([]Item, error) {
	const batch = 1000
	var items []Item
	var before int64
	for {
		ids, err := SelectIDs(ctx, q, now, f, before, batch)
		if err != nil {
			return nil, err
		}
		if len(items)+len(ids) > maxN {
			return nil, fmt.Errorf("%w: more than %d (narrow the filter, or raise --max)", ErrBulkTooLarge, maxN)
		}
		got, err := Items(ctx, q, ids)
		if err != nil {
			return nil, err
		}
		items = append(items, got...)
		if len(ids) < batch {
			return items, nil
		}
		before = ids[len(ids)-1]
	}
}

// skipReason says why action does not apply to a reminder in state s ("":
// it applies, as far as the state tells).
func skipReason(action BulkAction, s reminder.State) string {
	switch action {
	case BulkCancel:
		if s.Terminal() || s == reminder.Sending {
			return "already " + string(s)
		}
	case BulkExpire:
		if s != reminder.Quarantined {
			return string(s) + " (only quarantined reminders are expired; cancel the others)"
		}
	}
	return ""
}

func bulkDryRun(ctx context.Context, q pg.Querier, now time.Time, action BulkAction, items []Item, d Decision, stuck time.Duration, res *BulkResult) error {
	if action != BulkReplay {
		for _, it := range items {
			if why := skipReason(action, it.State); why != "" {
				res.Skipped[why]++
			} else {
				res.Changed++
			}
		}
		return nil
	}
	ids := make([]int64, len(items))
	for i, it := range items {
		ids[i] = it.ID
	}
	r, err := Replay(ctx, q, now, ReplaySelection{IDs: ids, StuckFor: stuck}, d)
	if err != nil {
		return err
	}
	res.Changed = r.Replayed
	if r.RefusedDeadline > 0 {
		res.Skipped["refused: deadline within the margin"] += r.RefusedDeadline
	}
	if r.RefusedPurged > 0 {
		res.Skipped["refused: payload purged"] += r.RefusedPurged
	}
	for _, s := range r.NotSelected {
		res.Skipped[notReplayable(s)]++
	}
	return nil
}

func notReplayable(s reminder.State) string {
	if s == "" {
		return "gone"
	}
	return string(s) + " (not replayable, or not stuck yet)"
}

// Event and audit reasons of bulk actions name the action; an expiry keeps
// the dead-letter prefix its statement has always written, so statistics
// still tell an operator's expiry from a deadline miss.
func bulkReason(action BulkAction, d Decision) string {
	switch action {
	case BulkExpire:
		return d.eventReason(ReasonPrefixDLQExpire + "[bulk] ")
	case BulkReplay:
		return d.eventReason(ReasonPrefixReplay + "[bulk] ")
	}
	return d.eventReason("bulk cancel: ")
}

// bulkOne applies action to one reminder and records the audit row, in one
// transaction. It returns "" when the reminder changed, else why not.
func bulkOne(ctx context.Context, db pg.Beginner, now time.Time, action BulkAction, it Item, d Decision, stuck time.Duration, filter []byte) (string, error) {
	if why := skipReason(action, it.State); why != "" {
		return why, nil
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return "", err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	why := ""
	switch action {
	case BulkCancel:
		st, err := intake.Cancel(ctx, tx, it.Tenant, it.Key, d.Actor, bulkReason(action, d))
		switch {
		case errors.Is(err, intake.ErrNotFound):
			why = "gone"
		case err != nil:
			return "", err
		case st != reminder.Canceled:
			why = "moved on"
		}
	case BulkExpire:
		rows, err := tx.Query(ctx, query("DLQExpire"), pgx.NamedArgs{
			"ids": []int64{it.ID}, "fences": []int64{it.Fence}, "now": now, "actor": d.Actor, "reason": bulkReason(action, d),
		})
		if err != nil {
			return "", err
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return "", err
		}
		if len(got) == 0 {
			why = "moved on"
		}
	case BulkReplay:
		dd := d
		dd.Reason = "[bulk] " + d.Reason
		r, err := Replay(ctx, tx, now, ReplaySelection{IDs: []int64{it.ID}, StuckFor: stuck}, dd)
		if err != nil {
			return "", err
		}
		switch {
		case r.Replayed == 1:
		case r.RefusedDeadline > 0:
			why = "refused: deadline within the margin"
		case r.RefusedPurged > 0:
			why = "refused: payload purged"
		case r.MovedOn > 0:
			why = "moved on"
		default:
			why = notReplayable(r.NotSelected[it.ID])
		}
	}
	if why != "" {
		return why, nil // nothing written: the transaction rolls back
	}
	detail, _ := json.Marshal(map[string]any{"from_state": it.State, "fence": it.Fence, "filter": json.RawMessage(filter)})
	if _, err := tx.Exec(ctx, query("Audit"), pgx.NamedArgs{
		"now": now, "actor": d.Actor, "channel": string(it.Channel), "reason": bulkReason(action, d),
		"actions": []string{"bulk." + string(action)}, "reminder_ids": []int64{it.ID}, "message_ids": []string{""},
		"details": [][]byte{detail},
	}); err != nil {
		return "", fmt.Errorf("recording the audit trail: %w", err)
	}
	return "", tx.Commit(ctx)
}
