// Package intake records reminder intent. It is what an application links to
// schedule, cancel and read reminders, and it works inside the caller's own
// pgx transaction: the reminder commits or rolls back with the business change
// that caused it (transactional enqueue), so there is no window where one
// exists without the other.
//
// Every path (this package, the nudge_schedule SQL function, nudgectl)
// validates with the same SQL function, nudge_invalid, and applies the same
// idempotency rule on (tenant, key): a repeat with the same content returns
// the existing reminder; the same key with different content is a
// *ConflictError. Batches are scheduled set-based, in one statement.
package intake

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

//go:embed queries.sql
var queriesSQL string

var queries = sqlfile.Parse("queries.sql", queriesSQL)

func query(name string) string { return queries.Get(name) }

// Querier is what every function here runs its statements on: pgx.Tx (to
// schedule inside the application's own transaction), *pgx.Conn and
// *pgxpool.Pool satisfy it. It is the one interface the whole of Nudge uses
// for this (Exec, Query, QueryRow).
type Querier = pg.Querier

// Request is one reminder to schedule.
type Request struct {
	// Tenant owns the reminder. Required.
	Tenant string `json:"tenant"`
	// Key is the logical key, unique per tenant: it names one notification
	// occurrence, e.g. "course-expiry:learner-42:course-7:2026-08-12". Required.
	Key string `json:"key"`
	// Channel is "email", "sms" or "webhook".
	Channel reminder.Channel `json:"channel"`
	// Recipient is an email address, an E.164 phone number, or a webhook's
	// target URL (http or https; see docs/operations.md for the data a
	// webhook takes: method and body).
	Recipient string `json:"recipient"`
	// Template names the message template rendered at send time.
	Template string `json:"template"`
	// Data is the template's data; it must marshal to a JSON object. Nil means {}.
	Data any `json:"data"`
	// DueAt is the earliest time the reminder may be sent. Required, unless
	// DueLocal gives it (exactly one of the two).
	DueAt time.Time `json:"due_at"`
	// Deadline is the business deadline: no send starts at or after it.
	// Required, unless DeadlineLocal gives it (exactly one of the two); after
	// the due time.
	Deadline time.Time `json:"deadline"`
	// TZ is the recipient's IANA zone ("Europe/Stockholm"; empty: UTC). The
	// local times below are read in it and the send window is evaluated in
	// it. Required with DueLocal or DeadlineLocal.
	TZ string `json:"tz,omitempty"`
	// DueLocal is the due time as a local wall-clock time in TZ,
	// "2027-03-28T09:00" (localtime.ParseWall), instead of DueAt. A time the
	// clock skips moves forward by the gap; one it shows twice is the
	// earlier instant (docs/local-time.md).
	DueLocal string `json:"due_local,omitempty"`
	// DeadlineLocal is the deadline as a local wall-clock time in TZ,
	// instead of Deadline.
	DeadlineLocal string `json:"deadline_local,omitempty"`
	// Window is when a send may start, in the recipient's local time
	// ("08:00-21:00", "mon-fri 09:00-17:00", "any"). Nil: the tenant's
	// policy for the channel applies.
	Window *localtime.Window `json:"window,omitempty"`
}

// Status says what scheduling did.
type Status string

const (
	// Created: a new reminder was recorded.
	Created Status = "created"
	// Exists: the same key with the same content was already recorded; nothing changed.
	Exists Status = "exists"
)

// Result identifies the reminder a request converged on.
type Result struct {
	ID     int64  `json:"id"`
	Status Status `json:"status"`
}

// ValidationError names the field of a request that is wrong and what was expected.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string { return fmt.Sprintf("field %q %s", e.Field, e.Reason) }

// ConflictError reports a logical key already scheduled with different content.
type ConflictError struct {
	Tenant, Key string
	ID          int64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("key %q of tenant %q is already scheduled (reminder %d) with different content", e.Key, e.Tenant, e.ID)
}

var (
	// ErrNotFound means no reminder matches.
	ErrNotFound = errors.New("reminder not found")
	// ErrConcurrent means another transaction scheduled the same key while
	// this one ran and had not committed when it started; retrying reads it.
	ErrConcurrent = errors.New("the same key was scheduled concurrently by another transaction; retry")
)

// Schedule records one reminder in q (typically the caller's transaction)
// through nudge_try_schedule, the SQL function a web tier in any language
// calls: the same validation, idempotency and statuses as ScheduleMany. So it
// works under the least-privileged nudge_intake login, for the tenants that
// login may act for (and a session narrowed with nudge.tenant), as under the
// operator and the owner; and a reminder per transaction costs PostgreSQL
// about a sixth of what the set-based statement did for one row, which was
// planned again for every call (0.45–0.53 against 2.9 CPU-s per 1,000:
// BenchmarkScheduleFunctionVsBulk, "Schedule, owner"). A tenant the session
// may not act for fails the call with SQLSTATE 42501. A key another
// transaction is scheduling waits for that transaction to end.
func Schedule(ctx context.Context, q Querier, r Request) (Result, error) {
	local := newLocalArgs(1)
	data, due, deadline, err := prepare(local, 0, &r)
	if err != nil {
		return Result{}, err
	}
	var (
		id            *int64
		status        string
		field, reason *string
	)
	if err := q.QueryRow(ctx, query("TrySchedule"), r.Tenant, r.Key, string(r.Channel), r.Recipient, r.Template, data,
		due, deadline, local.tz[0], local.due[0], local.deadline[0], local.open[0], local.close[0], local.days[0],
	).Scan(&id, &status, &field, &reason); err != nil {
		return Result{}, fmt.Errorf("scheduling reminder %q of tenant %q: %w", r.Key, r.Tenant, err)
	}
	o := toOutcome(r, id, status, field, reason)
	return o.Result, o.Err
}

// Outcome is the result of one request of a batch: Err is a
// *ValidationError or *ConflictError, or nil.
type Outcome struct {
	Result
	Err error
}

// ScheduleMany records many reminders in one round trip and returns one
// Outcome per request, in order. Invalid or conflicting requests do not stop
// the others; the returned error is only for a failure of the statement itself.
func ScheduleMany(ctx context.Context, q Querier, reqs []Request) ([]Outcome, error) {
	return ScheduleManyAs(ctx, q, "intake", reqs)
}

// ScheduleManyAs is ScheduleMany recording actor as the author of the
// "scheduled" events.
func ScheduleManyAs(ctx context.Context, q Querier, actor string, reqs []Request) ([]Outcome, error) {
	n := len(reqs)
	out := make([]Outcome, n)
	var (
		tenants, keys, channels, recipients, templates, datas = make([]string, n), make([]string, n),
			make([]string, n), make([]string, n), make([]string, n), make([]*string, n)
		dues, deadlines = make([]*time.Time, n), make([]*time.Time, n)
		local           = newLocalArgs(n)
	)
	for i := range reqs {
		// What PostgreSQL would refuse for the whole statement is refused
		// here for its own request: it is sent as empty strings and NULLs,
		// which the function reports as invalid too, and keeps this error.
		r := &reqs[i]
		data, due, deadline, err := prepare(local, i, r)
		if err != nil {
			out[i].Err = err
			continue
		}
		tenants[i], keys[i], channels[i] = r.Tenant, r.Key, string(r.Channel)
		recipients[i], templates[i] = r.Recipient, r.Template
		dues[i], deadlines[i], datas[i] = due, deadline, &data
	}
	rows, err := q.Query(ctx, query("ScheduleMany"), tenants, keys, channels, recipients, templates, datas,
		dues, deadlines, actor, local.tz, local.due, local.deadline, local.open, local.close, local.days)
	if err != nil {
		return nil, scheduleManyError(n, err)
	}
	defer rows.Close()
	i := 0
	for rows.Next() {
		var (
			id            *int64
			status        string
			field, reason *string
		)
		if err := rows.Scan(&id, &status, &field, &reason); err != nil {
			return nil, fmt.Errorf("scheduling reminders: reading result %d: %w", i, err)
		}
		if out[i].Err == nil {
			out[i] = toOutcome(reqs[i], id, status, field, reason)
		}
		i++
	}
	if err := rows.Err(); err != nil {
		return nil, scheduleManyError(n, err)
	}
	if i != n {
		return nil, fmt.Errorf("scheduling %d reminders: got %d results", n, i)
	}
	return out, nil
}

// prepare checks request i of a call for what is refused before PostgreSQL
// sees it (text limits, the data object, the zone and wall times: the same
// for Schedule and ScheduleMany) and fills its local-time columns in local.
// It returns the data as JSON text and r's instants, nil when not given.
func prepare(local localArgs, i int, r *Request) (data string, due, deadline *time.Time, err error) {
	if verr := checkText(*r); verr != nil {
		return "", nil, nil, verr
	}
	if data, err = marshalData(r.Data); err != nil {
		return "", nil, nil, err
	}
	if verr := local.set(i, *r); verr != nil {
		return "", nil, nil, verr
	}
	if !r.DueAt.IsZero() {
		due = &r.DueAt
	}
	if !r.Deadline.IsZero() {
		deadline = &r.Deadline
	}
	return data, due, deadline, nil
}

// scheduleManyError wraps a failure of the batch statement. A refused table
// privilege says which calls a login without one has: the statement writes
// the tables directly, which the web tier's nudge_intake login may not.
func scheduleManyError(n int, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("scheduling %d reminders: %w (ScheduleMany writes the tables itself: run it as nudge_operator "+
			"or the schema's owner; a nudge_intake login schedules with Schedule, or many at once with "+
			"SELECT * FROM nudge_schedule_many(...), schema 50)", n, err)
	}
	return fmt.Errorf("scheduling %d reminders: %w", n, err)
}

func marshalData(d any) (string, error) {
	var b []byte
	switch v := d.(type) {
	case nil:
		return "{}", nil
	case json.RawMessage:
		if len(v) == 0 {
			return "{}", nil
		}
		b = v
	default:
		var err error
		if b, err = json.Marshal(d); err != nil {
			return "", &ValidationError{Field: "data", Reason: "must be a JSON object: " + err.Error()}
		}
	}
	if verr := CheckData(b); verr != nil {
		return "", verr
	}
	return string(b), nil
}

func toOutcome(r Request, id *int64, status string, field, reason *string) Outcome {
	var o Outcome
	if id != nil {
		o.ID = *id
	}
	switch status {
	case "created":
		o.Status = Created
	case "exists":
		o.Status = Exists
	case "conflict":
		o.Err = &ConflictError{Tenant: r.Tenant, Key: r.Key, ID: o.ID}
	case "concurrent":
		o.Err = ErrConcurrent
	default:
		o.Err = &ValidationError{Field: deref(field), Reason: deref(reason)}
	}
	return o
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Cancel cancels the reminder (tenant, key) unless it was already sent or is
// being sent. It returns the reminder's state afterwards: Canceled, a terminal
// state it had already reached, or Sending when it is too late to stop.
func Cancel(ctx context.Context, q Querier, tenant, key, actor, reason string) (reminder.State, error) {
	var st *string
	if err := q.QueryRow(ctx, query("Cancel"), tenant, key, actor, reason).Scan(&st); err != nil {
		return "", fmt.Errorf("canceling %s/%s: %w", tenant, key, err)
	}
	if st == nil {
		return "", fmt.Errorf("canceling %s/%s: %w", tenant, key, ErrNotFound)
	}
	return reminder.State(*st), nil
}

// Reschedule moves the reminder (tenant, key) to new due and deadline times
// unless it was already sent or is being sent. It returns to pending under a
// new fence, so a message already queued for the old times is discarded. It
// returns the state afterwards: Pending, a terminal state it had reached, or
// Sending. Invalid times are a *ValidationError.
func Reschedule(ctx context.Context, q Querier, tenant, key string, dueAt, deadline time.Time, actor, reason string) (reminder.State, error) {
	var st *string
	if err := q.QueryRow(ctx, query("Reschedule"), tenant, key, dueAt, deadline, actor, reason).Scan(&st); err != nil {
		return "", changeError("rescheduling", tenant, key, err)
	}
	if st == nil {
		return "", fmt.Errorf("rescheduling %s/%s: %w", tenant, key, ErrNotFound)
	}
	return reminder.State(*st), nil
}
