package intake

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// ChangeStatus says what a change of intent (RescheduleTo, Update,
// CancelPrefix) did to one reminder. The values are those of the SQL
// functions' nudge_change rows (schema version 14), which a web tier in
// another language reads the same way.
type ChangeStatus string

const (
	// Changed: the reminder changed, under a new fence; a message already
	// queued for its old version is discarded.
	Changed ChangeStatus = "changed"
	// Unchanged: the reminder already is as asked; nothing was written.
	Unchanged ChangeStatus = "unchanged"
	// NotFound: the tenant has no reminder with the key.
	NotFound ChangeStatus = "not_found"
	// AlreadyTerminal: the reminder already ended (Change.State says how);
	// nothing changed.
	AlreadyTerminal ChangeStatus = "terminal"
	// AlreadySending: a send is in flight, too late to change; its outcome
	// will be recorded.
	AlreadySending ChangeStatus = "sending"
)

// Change is what a change of intent did to one reminder.
type Change struct {
	// ID is the reminder's, 0 when NotFound.
	ID  int64  `json:"id,omitempty"`
	Key string `json:"key"`
	// Status says what happened.
	Status ChangeStatus `json:"status"`
	// State is the reminder's state afterwards ("" when NotFound).
	State reminder.State `json:"state,omitempty"`
}

// Content is a reminder's new content for Update. A zero field keeps what
// the reminder has: Data nil keeps its data (an empty map replaces it with {}).
type Content struct {
	Recipient string `json:"recipient,omitempty"`
	Template  string `json:"template,omitempty"`
	Data      any    `json:"data,omitempty"`
}

// MaxCancelPrefix bounds how many reminders one CancelPrefix call cancels
// (nudge_cancel_prefix refuses a larger limit).
const MaxCancelPrefix = 10000

// RescheduleTo moves the reminder (tenant, key) to new due and deadline
// times, in q (typically the caller's transaction). Unlike Reschedule it
// answers every case as a Change: Changed (back to pending under a new
// fence), Unchanged (it already has these times), NotFound, AlreadyTerminal
// or AlreadySending. Invalid times are a *ValidationError.
func RescheduleTo(ctx context.Context, q Querier, tenant, key string, dueAt, deadline time.Time, actor, reason string) (Change, error) {
	c, err := scanChange(q.QueryRow(ctx, query("RescheduleTo"), tenant, key, dueAt, deadline, actor, reason))
	if err != nil {
		return c, changeError("rescheduling", tenant, key, err)
	}
	return c, nil
}

// RescheduleWindow is RescheduleTo that also sets the reminder's own send
// window in the recipient's zone; a nil window clears it, so the tenant's
// policy for the channel applies again. Unchanged when the times and the
// window are the ones it has.
func RescheduleWindow(ctx context.Context, q Querier, tenant, key string, dueAt, deadline time.Time,
	window *localtime.Window, actor, reason string) (Change, error) {
	var open, close *string
	var days *int32
	if window != nil {
		o, c := windowColumns(*window)
		d := int32(window.Days())
		open, close, days = o, &c, &d
	}
	c, err := scanChange(q.QueryRow(ctx, query("RescheduleWindow"), tenant, key, dueAt, deadline, open, close, days,
		actor, reason))
	if err != nil {
		return c, changeError("rescheduling", tenant, key, err)
	}
	return c, nil
}

// Update gives the reminder (tenant, key) new content, in q: a new version,
// back to pending under a new fence with its due time and deadline kept, so
// a message already queued for the old content is discarded and the new one
// is sent instead. Unchanged when the content is the same. Invalid content
// is a *ValidationError.
func Update(ctx context.Context, q Querier, tenant, key string, c Content, actor, reason string) (Change, error) {
	for _, f := range [][2]string{{"recipient", c.Recipient}, {"template", c.Template}} {
		if verr := CheckString(f[0], f[1]); verr != nil {
			return Change{}, verr
		}
	}
	var data *string
	if c.Data != nil {
		d, err := marshalData(c.Data)
		if err != nil {
			return Change{}, err
		}
		data = &d
	}
	ch, err := scanChange(q.QueryRow(ctx, query("Update"), tenant, key, nullIfEmpty(c.Recipient),
		nullIfEmpty(c.Template), data, actor, reason))
	if err != nil {
		return ch, changeError("updating", tenant, key, err)
	}
	return ch, nil
}

// CancelPrefix cancels, in q, the open reminders of tenant whose key starts
// with prefix (no wildcards), at most limit of them (1 to MaxCancelPrefix),
// oldest first. It returns one Change per reminder touched: Changed (now
// canceled) or AlreadySending; reminders that already ended are left out.
// Fewer Changed than limit means none matching is left open.
func CancelPrefix(ctx context.Context, q Querier, tenant, prefix string, limit int, actor, reason string) ([]Change, error) {
	if prefix == "" {
		return nil, &ValidationError{Field: "key_prefix", Reason: "is required (an empty prefix would match every key)"}
	}
	if limit < 1 || limit > MaxCancelPrefix {
		return nil, &ValidationError{Field: "limit", Reason: fmt.Sprintf("must be from 1 to %d, got %d", MaxCancelPrefix, limit)}
	}
	rows, err := q.Query(ctx, query("CancelPrefix"), tenant, prefix, limit, actor, reason)
	if err != nil {
		return nil, changeError("canceling by prefix", tenant, prefix+"*", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Change, error) { return scanChange(r) })
	if err != nil {
		return nil, changeError("canceling by prefix", tenant, prefix+"*", err)
	}
	return out, nil
}

// PrefixCount is how many reminders CancelPrefix would find now.
type PrefixCount struct {
	// Open reminders would be canceled.
	Open int `json:"open"`
	// Sending ones are too late to cancel.
	Sending int `json:"sending"`
}

// CountPrefix counts the reminders of tenant whose key starts with prefix
// that CancelPrefix would touch: a dry run. It reads what q's role may see
// (the intake role: its own tenants' reminders).
func CountPrefix(ctx context.Context, q Querier, tenant, prefix string) (PrefixCount, error) {
	var c PrefixCount
	if err := q.QueryRow(ctx, query("CountPrefix"), tenant, prefix).Scan(&c.Open, &c.Sending); err != nil {
		return c, fmt.Errorf("counting reminders %s/%s*: %w", tenant, prefix, err)
	}
	return c, nil
}

func scanChange(row pgx.Row) (Change, error) {
	var (
		c     Change
		id    *int64
		state *string
	)
	if err := row.Scan(&id, &c.Key, &c.Status, &state); err != nil {
		return Change{}, err
	}
	if id != nil {
		c.ID = *id
	}
	if state != nil {
		c.State = reminder.State(*state)
	}
	return c, nil
}

// changeError turns the SQL functions' invalid-input error (SQLSTATE 22023
// naming the field as its column, message 'nudge: field "F" R') into a
// *ValidationError and wraps the rest.
func changeError(op, tenant, key string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22023" && pgErr.ColumnName != "" {
		reason := strings.TrimPrefix(pgErr.Message, fmt.Sprintf("nudge: field %q ", pgErr.ColumnName))
		return &ValidationError{Field: pgErr.ColumnName, Reason: reason}
	}
	return fmt.Errorf("%s %s/%s: %w", op, tenant, key, err)
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
