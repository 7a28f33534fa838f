// Package reminder is Nudge's shared vocabulary: the states a reminder moves
// through and the transitions allowed between them (Transitions, with who may
// take each and its reason code), the outcomes of send attempts, the channels
// a reminder is sent on, and the row that records it. Programs that write
// intent (pkg/intake) and the binaries that work it agree on these values;
// the database enforces the same states with CHECK constraints, and a test
// runs every statement that writes reminders against the transition table.
package reminder

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nudgehq/nudge/pkg/localtime"
)

// State is where a reminder stands. Terminal states never change again,
// but for an operator's replay of a failed reminder.
type State string

// The lifecycle: pending → enqueued (a dispatcher claimed it under a dispatch
// lease and publishes its message; the broker's confirmation is recorded for
// the claim's whole batch) → sending (a worker claimed an attempt) →
// delivered, or → retrying (a retry message waits in a tier) → sending …
// leased is what dispatchers before schema version 7 claimed into (then
// enqueued once confirmed); it is still accepted wherever enqueued is.
// A message that keeps failing (it crashes or panics its consumer) is
// quarantined: its message waits in the dead-letter queue for an operator to
// replay or expire it. Any open state can end as expired (deadline reached)
// and every open state but sending can end as canceled. Transitions lists
// every allowed move.
const (
	Pending  State = "pending"
	Leased   State = "leased"
	Enqueued State = "enqueued"
	Sending  State = "sending"
	Retrying State = "retrying"
	// Quarantined is open but parked: only an operator's replay moves it on.
	Quarantined State = "quarantined"
	Delivered   State = "delivered"
	Failed      State = "failed"
	Expired     State = "expired"
	Canceled    State = "canceled"
)

// States lists every state in lifecycle order.
var States = []State{Pending, Leased, Enqueued, Sending, Retrying, Quarantined, Delivered, Failed, Expired, Canceled}

// Terminal reports whether s is final: the reminder's outcome is decided.
func (s State) Terminal() bool {
	switch s {
	case Delivered, Failed, Expired, Canceled:
		return true
	}
	return false
}

// Channel is how a reminder reaches its recipient.
type Channel string

// The supported channels; each has its own queue, worker Deployment and limits.
const (
	Email Channel = "email"
	SMS   Channel = "sms"
	// Webhook is an HTTP request to an application (a cleanup job such as
	// "DELETE https://app.internal/learners/42/drafts/7", or any callback):
	// the recipient is the target URL, the template names the action, and
	// the data may carry the method and a JSON body (docs/operations.md).
	Webhook Channel = "webhook"
)

// Channels lists every channel.
var Channels = []Channel{Email, SMS, Webhook}

// Valid reports whether c is a supported channel.
func (c Channel) Valid() bool { return slices.Contains(Channels, c) }

// Reminder is one row of the reminders table.
type Reminder struct {
	ID        int64           `json:"id"`
	Tenant    string          `json:"tenant"`
	Key       string          `json:"key"`
	Channel   Channel         `json:"channel"`
	Recipient string          `json:"recipient"`
	Template  string          `json:"template"`
	Data      json.RawMessage `json:"data"`
	DueAt     time.Time       `json:"due_at"`
	Deadline  time.Time       `json:"deadline"`
	// TZ is the recipient's IANA zone ("" means UTC): local due times and
	// deadlines were read in it, and the send window is evaluated in it.
	TZ string `json:"tz,omitempty"`
	// Window is the reminder's own send window; nil means its tenant's
	// policy for its channel applies (docs/local-time.md).
	Window *localtime.Window `json:"window,omitempty"`
	// RequestedDueAt is the due time intake asked for, once the dispatcher
	// moved DueAt to a send window's opening (nil: DueAt is it).
	RequestedDueAt *time.Time `json:"requested_due_at,omitempty"`
	IdempotencyKey string     `json:"idempotency_key"`
	State          State      `json:"state"`
	Fence          int64      `json:"fence"`
	LeaseUntil     *time.Time `json:"lease_until,omitempty"`
	Attempts       int        `json:"attempts"`
	NextAttemptAt  *time.Time `json:"next_attempt_at,omitempty"`
	EnqueuedAt     *time.Time `json:"enqueued_at,omitempty"`
	LastError      string     `json:"last_error,omitempty"`
	Reason         string     `json:"reason,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
	FinishedAt     *time.Time `json:"finished_at,omitempty"`
}

// Zone returns the recipient's zone: TZ, or UTC when it is empty (or, for a
// zone this binary's zone database does not know, UTC with the error).
func (r Reminder) Zone() (*time.Location, error) {
	if r.TZ == "" {
		return time.UTC, nil
	}
	loc, err := localtime.LoadZone(r.TZ)
	if err != nil {
		return time.UTC, err
	}
	return loc, nil
}

// StoredWindow reads a window stored as the SQL twin's (open, close, days)
// columns, with the times selected as minutes after midnight: a NULL close is
// no window (nil), a NULL open any time (docs/local-time.md).
func StoredWindow(open, close, days *int32) (*localtime.Window, error) {
	if close == nil {
		return nil, nil
	}
	if open == nil {
		w := localtime.AnyTime
		return &w, nil
	}
	var d int32
	if days != nil {
		d = *days
	}
	w, err := localtime.NewWindow(localtime.Weekdays(d), localtime.TimeOfDay(*open), localtime.TimeOfDay(*close))
	if err != nil {
		return nil, fmt.Errorf("stored send window: %w", err)
	}
	return &w, nil
}

// Event is one recorded state transition.
type Event struct {
	// ID is the reminder_events row's, 0 for an event folded into the
	// reminder's row (schema version 30: the happy path's claim, first
	// attempt and delivery), which has none.
	ID    int64  `json:"id"`
	From  State  `json:"from,omitempty"`
	To    State  `json:"to"`
	Fence int64  `json:"fence"`
	Actor string `json:"actor"`
	// Code is the machine-readable reason (empty on events written before
	// schema version 9).
	Code   Code      `json:"code,omitempty"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}
