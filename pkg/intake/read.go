package intake

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// scanReminder reads a row of the statement Get.
func scanReminder(row pgx.Row) (reminder.Reminder, error) {
	var r reminder.Reminder
	var open, close, days *int32
	err := row.Scan(&r.ID, &r.Tenant, &r.Key, &r.Channel, &r.Recipient, &r.Template, &r.Data, &r.DueAt,
		&r.Deadline, &r.IdempotencyKey, &r.State, &r.Fence, &r.LeaseUntil, &r.Attempts, &r.NextAttemptAt,
		&r.EnqueuedAt, &r.LastError, &r.Reason, &r.CreatedAt, &r.UpdatedAt, &r.FinishedAt,
		&r.TZ, &r.RequestedDueAt, &open, &close, &days)
	if err != nil {
		return r, err
	}
	r.Window, err = reminder.StoredWindow(open, close, days)
	return r, err
}

// Get returns the reminder with the given id, or ErrNotFound.
func Get(ctx context.Context, q Querier, id int64) (reminder.Reminder, error) {
	r, err := scanReminder(q.QueryRow(ctx, query("Get"), id, nil, nil))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("reading reminder %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("reading reminder %d: %w", id, err)
	}
	return r, nil
}

// GetByKey returns the reminder with the logical key (tenant, key), or ErrNotFound.
func GetByKey(ctx context.Context, q Querier, tenant, key string) (reminder.Reminder, error) {
	r, err := scanReminder(q.QueryRow(ctx, query("Get"), nil, tenant, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("reading reminder %s/%s: %w", tenant, key, ErrNotFound)
	}
	if err != nil {
		return r, fmt.Errorf("reading reminder %s/%s: %w", tenant, key, err)
	}
	return r, nil
}

// Events returns the reminder's state transitions, oldest first: its
// timeline (the view reminder_timeline, schema version 30), the events
// stored in reminder_events and those folded into the reminder's row (whose
// ID is 0).
func Events(ctx context.Context, q Querier, id int64) ([]reminder.Event, error) {
	rows, err := q.Query(ctx, `SELECT coalesce(id, 0), coalesce(from_state, ''), to_state, fence, actor, coalesce(code, ''),
		reason, at FROM reminder_timeline WHERE reminder_id = $1 ORDER BY seq`, id)
	if err != nil {
		return nil, fmt.Errorf("reading events of reminder %d: %w", id, err)
	}
	evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (reminder.Event, error) {
		var e reminder.Event
		err := row.Scan(&e.ID, &e.From, &e.To, &e.Fence, &e.Actor, &e.Code, &e.Reason, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading events of reminder %d: %w", id, err)
	}
	return evs, nil
}

// SendWindow returns the send window that applies to r: its own, else its
// tenant's policy for its channel, else the default (nudge_send_window).
func SendWindow(ctx context.Context, q Querier, r reminder.Reminder) (localtime.Window, error) {
	if r.Window != nil {
		return *r.Window, nil
	}
	var open, close, days *int32
	err := q.QueryRow(ctx, `SELECT (extract(epoch FROM window_open) / 60)::int, (extract(epoch FROM window_close) / 60)::int,
		window_days FROM nudge_send_window($1, $2, NULL, NULL, NULL)`, r.Tenant, string(r.Channel)).Scan(&open, &close, &days)
	if err != nil {
		return localtime.AnyTime, fmt.Errorf("reading the send window of reminder %d: %w", r.ID, err)
	}
	w, err := reminder.StoredWindow(open, close, days)
	if err != nil || w == nil {
		return localtime.AnyTime, err
	}
	return *w, nil
}
