package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Filter selects reminders for nudgectl list, its bulk actions and the
// console. Every field is optional; what is given must all match.
type Filter struct {
	// IDs selects these reminders.
	IDs     []int64          `json:"ids,omitempty"`
	Tenant  string           `json:"tenant,omitempty"`
	States  []reminder.State `json:"states,omitempty"`
	Channel reminder.Channel `json:"channel,omitempty"`
	// KeyPrefix matches keys that start with it (a whole key matches itself).
	KeyPrefix string `json:"key_prefix,omitempty"`
	// DueFrom <= due_at < DueTo, DeadlineFrom <= deadline < DeadlineTo; nil: unbounded.
	DueFrom      *time.Time `json:"due_from,omitempty"`
	DueTo        *time.Time `json:"due_to,omitempty"`
	DeadlineFrom *time.Time `json:"deadline_from,omitempty"`
	DeadlineTo   *time.Time `json:"deadline_to,omitempty"`
	// Late selects reminders due at or before now that are not terminal.
	Late bool `json:"late,omitempty"`
	// Reason matches, case-insensitively, part of the row's reason or last error.
	Reason string `json:"reason,omitempty"`
}

// Validate reports operator input that cannot select anything sensible.
func (f Filter) Validate() error {
	for _, s := range f.States {
		if !slices.Contains(reminder.States, s) {
			return fmt.Errorf("--state %q: want one of %s", s, joinStates(reminder.States))
		}
	}
	if f.Channel != "" && !f.Channel.Valid() {
		return fmt.Errorf(`--channel %q: want "email" or "sms"`, f.Channel)
	}
	if f.DueFrom != nil && f.DueTo != nil && !f.DueFrom.Before(*f.DueTo) {
		return errors.New("--due-from must be before --due-to")
	}
	if f.DeadlineFrom != nil && f.DeadlineTo != nil && !f.DeadlineFrom.Before(*f.DeadlineTo) {
		return errors.New("--deadline-from must be before --deadline-to")
	}
	return nil
}

// Empty reports whether the filter selects every reminder.
func (f Filter) Empty() bool {
	return len(f.IDs) == 0 && f.Tenant == "" && len(f.States) == 0 && f.Channel == "" && f.KeyPrefix == "" &&
		f.DueFrom == nil && f.DueTo == nil && f.DeadlineFrom == nil && f.DeadlineTo == nil && !f.Late && f.Reason == ""
}

// IncludesPending reports whether f may select pending reminders, among
// them those without a state row yet (due far ahead: the promoter inserts
// it), which only a walk of reminders finds.
func (f Filter) IncludesPending() bool {
	return len(f.States) == 0 || slices.Contains(f.States, reminder.Pending)
}

func (f Filter) args(now time.Time, before int64, limit int) pgx.NamedArgs {
	ids := f.IDs
	if ids == nil {
		ids = []int64{}
	}
	return pgx.NamedArgs{
		"now": now, "before": before, "limit": limit, "ids": ids, "tenant": f.Tenant,
		"states": stateStrings(f.States), "channel": string(f.Channel), "key_prefix": f.KeyPrefix,
		"due_from": f.DueFrom, "due_to": f.DueTo, "deadline_from": f.DeadlineFrom, "deadline_to": f.DeadlineTo,
		"late": f.Late, "reason": f.Reason,
	}
}

// Paging bounds.
const (
	// DefaultPageSize is a page's size unless told otherwise.
	DefaultPageSize = 50
	// MaxPageSize bounds a page.
	MaxPageSize = 500
	// CountCap bounds a count: up to it a count is exact, beyond it the
	// count says "more than CountCap" (Count.Exact false) rather than walk
	// the whole table.
	CountCap = 10000
)

// Page is where a page of a list starts: the keyset cursor (the previous
// page's Next; 0 for the first page) and its size (0: DefaultPageSize; at
// most MaxPageSize).
type Page struct {
	Before int64 `json:"before,omitempty"`
	Size   int   `json:"size,omitempty"`
}

// Count is how many reminders a filter selects: exactly N, or, when Exact is
// false, more than N (the count stopped at CountCap).
type Count struct {
	N     int  `json:"n"`
	Exact bool `json:"exact"`
}

func (c Count) String() string {
	if c.Exact {
		return fmt.Sprint(c.N)
	}
	return fmt.Sprintf("more than %d", c.N)
}

// Item is one listed reminder: its row without the payload.
type Item struct {
	ID         int64            `json:"id"`
	Tenant     string           `json:"tenant"`
	Key        string           `json:"key"`
	Channel    reminder.Channel `json:"channel"`
	Recipient  string           `json:"recipient"`
	Template   string           `json:"template"`
	State      reminder.State   `json:"state"`
	Fence      int64            `json:"fence"`
	DueAt      time.Time        `json:"due_at"`
	Deadline   time.Time        `json:"deadline"`
	Attempts   int              `json:"attempts"`
	Reason     string           `json:"reason,omitempty"`
	LastError  string           `json:"last_error,omitempty"`
	CreatedAt  time.Time        `json:"created_at"`
	UpdatedAt  time.Time        `json:"updated_at"`
	FinishedAt *time.Time       `json:"finished_at,omitempty"`
	Purged     bool             `json:"purged,omitempty"`
	// TZ is the recipient's IANA time zone when the schema records one ("": none).
	TZ string `json:"tz,omitempty"`
}

// ListPage is one page of a list, newest first.
type ListPage struct {
	Items []Item `json:"items"`
	// Next is the cursor of the next page (Page.Before); 0: this is the last.
	Next int64 `json:"next,omitempty"`
	// Count is how many reminders the filter selects in all.
	Count Count `json:"count"`
}

// List returns one page of the reminders f selects, newest first, and how
// many it selects in all (exact up to CountCap). now is the time Late is
// judged at.
func List(ctx context.Context, q pg.Querier, now time.Time, f Filter, p Page) (ListPage, error) {
	out := ListPage{Items: []Item{}}
	if err := f.Validate(); err != nil {
		return out, err
	}
	size := p.Size
	if size <= 0 {
		size = DefaultPageSize
	}
	size = min(size, MaxPageSize)
	ids, err := SelectIDs(ctx, q, now, f, p.Before, size+1)
	if err != nil {
		return out, err
	}
	if len(ids) > size {
		ids = ids[:size]
		out.Next = ids[size-1]
	}
	if out.Items, err = Items(ctx, q, ids); err != nil {
		return out, err
	}
	if p.Before == 0 && out.Next == 0 {
		out.Count = Count{N: len(ids), Exact: true}
	} else if out.Count, err = CountOf(ctx, q, now, f); err != nil {
		return out, err
	}
	return out, nil
}

// CountOf counts the reminders f selects, exactly up to CountCap.
func CountOf(ctx context.Context, q pg.Querier, now time.Time, f Filter) (Count, error) {
	ids, err := SelectIDs(ctx, q, now, f, 0, CountCap+1)
	if err != nil {
		return Count{}, err
	}
	if len(ids) > CountCap {
		return Count{N: CountCap}, nil
	}
	return Count{N: len(ids), Exact: true}, nil
}

// SelectIDs returns the IDs f selects below the cursor before (0: from the
// newest), newest first, at most limit of them.
func SelectIDs(ctx context.Context, q pg.Querier, now time.Time, f Filter, before int64, limit int) ([]int64, error) {
	name := "ListIDs"
	if f.IncludesPending() {
		name = "ListIDsAll"
	}
	rows, err := q.Query(ctx, query(name), f.args(now, before, limit))
	if err != nil {
		return nil, fmt.Errorf("selecting reminders: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("selecting reminders: %w", err)
	}
	return ids, nil
}

// Items reads the listed columns of the reminders ids, newest first.
func Items(ctx context.Context, q pg.Querier, ids []int64) ([]Item, error) {
	if len(ids) == 0 {
		return []Item{}, nil
	}
	rows, err := q.Query(ctx, query("ListRows"), pgx.NamedArgs{"ids": ids})
	if err != nil {
		return nil, fmt.Errorf("reading reminders: %w", err)
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Item, error) {
		var it Item
		err := row.Scan(&it.ID, &it.Tenant, &it.Key, &it.Channel, &it.Recipient, &it.Template, &it.State, &it.Fence,
			&it.DueAt, &it.Deadline, &it.Attempts, &it.Reason, &it.LastError, &it.CreatedAt, &it.UpdatedAt,
			&it.FinishedAt, &it.Purged, &it.TZ)
		return it, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading reminders: %w", err)
	}
	return items, nil
}

// Attempt is one delivery attempt of a reminder.
type Attempt struct {
	Attempt    int        `json:"attempt"`
	Fence      int64      `json:"fence"`
	Worker     string     `json:"worker"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// Outcome is delivered, retryable, permanent or stale; "" while in
	// flight (or its worker died mid-send).
	Outcome           string `json:"outcome,omitempty"`
	ProviderMessageID string `json:"provider_message_id,omitempty"`
	Error             string `json:"error,omitempty"`
}

// Detail is everything known about one reminder: its row, its timeline, its
// attempts and its dispatch batch.
type Detail struct {
	Item     Item             `json:"reminder"`
	Events   []reminder.Event `json:"events"`
	Attempts []Attempt        `json:"attempts"`
	Publish  Publish          `json:"publish"`
}

// ErrNotFound: no reminder has that ID.
var ErrNotFound = intake.ErrNotFound

// ReadDetail reads reminder id's Detail, or ErrNotFound.
func ReadDetail(ctx context.Context, q pg.Querier, id int64) (Detail, error) {
	var d Detail
	items, err := Items(ctx, q, []int64{id})
	if err != nil {
		return d, err
	}
	if len(items) == 0 {
		return d, fmt.Errorf("reminder %d: %w", id, ErrNotFound)
	}
	d.Item = items[0]
	if d.Events, err = intake.Events(ctx, q, id); err != nil {
		return d, err
	}
	rows, err := q.Query(ctx, query("Attempts"), pgx.NamedArgs{"id": id})
	if err != nil {
		return d, fmt.Errorf("reading the attempts of reminder %d: %w", id, err)
	}
	d.Attempts, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attempt, error) {
		var a Attempt
		err := row.Scan(&a.Attempt, &a.Fence, &a.Worker, &a.StartedAt, &a.FinishedAt, &a.Outcome,
			&a.ProviderMessageID, &a.Error)
		return a, err
	})
	if err != nil {
		return d, fmt.Errorf("reading the attempts of reminder %d: %w", id, err)
	}
	if d.Publish, err = PublishOf(ctx, q, id); err != nil {
		return d, err
	}
	return d, nil
}

// Minute is what happened in one minute: the runbook's questions as rates.
type Minute struct {
	Start time.Time `json:"start"`
	// Scheduled reminders (is intent still written), Claimed by the
	// dispatcher (is it advancing), Started attempts (is the queue
	// draining), Terminal outcomes (are workers finishing), Quarantined.
	Scheduled   int64 `json:"scheduled"`
	Claimed     int64 `json:"claimed"`
	Started     int64 `json:"started"`
	Terminal    int64 `json:"terminal"`
	Quarantined int64 `json:"quarantined"`
}

// MinutesScan bounds the events ReadMinutes reads: the newest ones only, so
// the read costs the same however large the table is. A fleet that writes
// more events than this in an hour shows the most recent part of the hour.
const MinutesScan = 500000

// ReadMinutes returns the hour before now, one Minute each, oldest first.
func ReadMinutes(ctx context.Context, q pg.Querier, now time.Time) ([]Minute, error) {
	out := make([]Minute, 60)
	for i := range out {
		out[i].Start = now.Add(time.Duration(i-60) * time.Minute)
	}
	rows, err := q.Query(ctx, query("Minutes"), pgx.NamedArgs{"now": now, "scan": MinutesScan})
	if err != nil {
		return nil, fmt.Errorf("reading the last hour: %w", err)
	}
	var (
		ago int
		m   Minute
	)
	_, err = pgx.ForEachRow(rows, []any{&ago, &m.Scheduled, &m.Claimed, &m.Started, &m.Terminal, &m.Quarantined}, func() error {
		if ago < 0 || ago >= 60 {
			return nil
		}
		i := 59 - ago
		start := out[i].Start
		out[i] = m
		out[i].Start = start
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the last hour: %w", err)
	}
	return out, nil
}
