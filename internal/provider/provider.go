// Package provider is the boundary between a worker and whatever delivers a
// message to a person (an SMTP relay, an SMS API). It defines what a send is
// and how a failure is classified, because the worker's retry decision depends
// only on that classification: retryable failures go back through a retry tier
// with backoff, permanent ones end the reminder as failed.
package provider

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nudgehq/nudge/pkg/reminder"
)

// Message is one send. IdempotencyKey is stable across every attempt of the
// same reminder, so a provider that deduplicates turns a retry after an
// unknown outcome into a no-op.
type Message struct {
	ReminderID     int64
	IdempotencyKey string
	Tenant         string
	Recipient      string
	Template       string
	Data           map[string]any
	Deadline       time.Time
	// Gate, when set, is the caller's last check before the request leaves:
	// an adapter calls it (through Open) immediately before it writes the
	// request to the provider, after every wait of its own (for a pooled
	// connection, a dial), on Send's goroutine, and again before each
	// resend on another connection. A non-nil error means the request must
	// not leave: Send returns, having sent nothing, the *Error Open made of
	// it. Nil: no check. The worker's gate refuses a send whose deadline is
	// within its margin.
	Gate func() error
	// Provider is the provider the attempt is recorded as going to (its
	// claim recorded Chooser.Current), "" when none was recorded.
	Provider string
	// Route, when set, records that the attempt goes to provider name
	// instead of Provider. A sender over several providers (sms.Failover)
	// calls it before the request leaves for a provider other than
	// Provider; a non-nil error means the request must not leave (Send
	// returns a retryable CodeNotStarted error). Nil: nothing to record.
	Route func(name string) error
	// Earlier are the reminder's earlier attempts whose outcome is unknown
	// (no answer came, or their worker died mid-send): the provider may hold
	// a message from any of them. A Looker searches for it with these; Send
	// ignores them.
	Earlier []Earlier
}

// CodeNotStarted is the code of the error Send returns when Message.Gate
// refused the send: nothing left for the provider.
const CodeNotStarted = "not_started"

// Open runs m.Gate, if set, and returns nil when the request may leave, or
// a retryable *Error with CodeNotStarted wrapping the gate's refusal.
func (m Message) Open() error {
	if m.Gate == nil {
		return nil
	}
	if err := m.Gate(); err != nil {
		return RetryableError(CodeNotStarted, 0, fmt.Errorf("reminder %d not sent: %w", m.ReminderID, err))
	}
	return nil
}

// Earlier is an earlier attempt of a reminder whose outcome is unknown.
type Earlier struct {
	// AttemptID is the attempt's row id.
	AttemptID int64
	// ProviderID is the id the provider gave, when one was recorded (an
	// answer that carried an id but could not be read as an acceptance).
	ProviderID string
	// Started is when the attempt was claimed: the provider cannot have
	// accepted its message before.
	Started time.Time
	// Provider is the provider its request went to, "" when not recorded
	// (any of the channel's providers may hold its message).
	Provider string
}

// Chooser is a Sender that names the provider its next Send goes to, so
// the worker records it on the attempt it claims: an adapter names itself,
// a failover its current choice.
type Chooser interface {
	Sender
	Current() string
}

// Since returns the earliest start of msg.Earlier (zero when it is empty).
func (m Message) Since() time.Time {
	var t time.Time
	for _, e := range m.Earlier {
		if t.IsZero() || e.Started.Before(t) {
			t = e.Started
		}
	}
	return t
}

// Sender delivers one message. It returns the provider's message id on
// acceptance. Errors should be *Error so the caller can tell retryable from
// permanent; any other error is treated as retryable (outcome unknown).
type Sender interface {
	Send(ctx context.Context, msg Message) (providerID string, err error)
}

// Looker is a Sender that can tell whether it already holds a message from
// an earlier attempt of the same reminder whose outcome is unknown, so the
// worker can record it delivered instead of sending it again. A provider
// that does not deduplicate (Twilio) needs this to keep "once per logical
// reminder"; for one that does it is a cheap confirmation.
type Looker interface {
	Sender
	// Lookup searches for a message of msg's reminder left by one of
	// msg.Earlier and returns its provider id. It returns an error wrapping
	// ErrNotFound when there is none, a permanent *Error when the provider
	// took the message and then refused it for good (the reminder fails
	// without another send), and any other error when it could not tell
	// (the caller must neither send nor conclude).
	Lookup(ctx context.Context, msg Message) (providerID string, err error)
}

// ErrNotFound means a Lookup found no message: the earlier attempts did not
// reach the provider, and sending is safe.
var ErrNotFound = errors.New("no such message at the provider")

// Kind classifies a failed send.
type Kind int

const (
	// Retryable: the send may succeed later (timeout, 429, 5xx, connection
	// refused). The outcome may be unknown: the provider may have accepted.
	Retryable Kind = iota
	// Permanent: the send will never succeed (4xx, invalid address, unknown
	// template). The reminder ends as failed.
	Permanent
)

func (k Kind) String() string {
	if k == Permanent {
		return "permanent"
	}
	return "retryable"
}

// Error is a classified send failure.
type Error struct {
	Kind Kind
	// RetryAfter is the provider's requested wait (HTTP Retry-After), zero if none.
	RetryAfter time.Duration
	// Code is a short machine-readable reason such as "http_429", "http_503",
	// "timeout", "smtp_550", "template".
	Code string
	Err  error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s send failure (%s): %v", e.Kind, e.Code, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Outcome is what an attempt that failed with e came to: permanent, not
// sent (the gate refused it: CodeNotStarted), or retryable with the answer
// known (the provider said "not now") or unknown (no answer came, it may
// have accepted: codes "timeout", "network", "canceled", "unknown", and
// "bad_response" for an acceptance whose body could not be read). A reminder that ends undelivered after an
// unknown outcome says so.
func (e *Error) Outcome() reminder.Outcome {
	switch {
	case e.Kind == Permanent:
		return reminder.OutcomePermanent
	case e.Code == CodeNotStarted:
		return reminder.OutcomeNotSent
	case e.Code == "timeout" || e.Code == "network" || e.Code == "canceled" || e.Code == "unknown" ||
		e.Code == "bad_response":
		return reminder.OutcomeUnknown
	}
	return reminder.OutcomeRetryable
}

// Classify returns the classification of err: a *Error found with errors.As,
// or a retryable one with code "unknown" for anything else.
func Classify(err error) *Error {
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	return &Error{Kind: Retryable, Code: "unknown", Err: err}
}

// RetryableError builds a retryable *Error.
func RetryableError(code string, retryAfter time.Duration, err error) *Error {
	return &Error{Kind: Retryable, Code: code, RetryAfter: retryAfter, Err: err}
}

// PermanentError builds a permanent *Error.
func PermanentError(code string, err error) *Error {
	return &Error{Kind: Permanent, Code: code, Err: err}
}

// CancelWatcher is a send context (the worker's) that tells an adapter when
// the send is canceled (the worker's grace period ran out at shutdown)
// without a timer, a goroutine or an allocation per send. An adapter that
// enforces ctx.Deadline() itself (a connection deadline) needs nothing else
// from the context, and watches with it instead of context.AfterFunc, which
// would arm the context's deadline timer. Adapters that do not are
// unaffected: context.AfterFunc still works on such a context.
type CancelWatcher interface {
	context.Context
	// WatchCancel interrupts r when the context is canceled before
	// StopWatching is called (at once if it has already ended). It does not
	// when the deadline passes: the caller enforces Deadline. One watch at
	// a time.
	WatchCancel(r Interrupter)
	// StopWatching undoes WatchCancel. It reports whether it did so before
	// r was interrupted; false: r was or is being interrupted, or the
	// context ended.
	StopWatching() bool
}

// Interrupter is a request in flight that can be cut short: Interrupt
// makes its blocked reads and writes return at once (a connection sets a
// deadline in the past). A pointer that implements it is passed to
// CancelWatcher without allocating, where a closure would be.
type Interrupter interface {
	Interrupt()
}

// WithTimeout is context.WithTimeout(ctx, timeout) for an adapter's request,
// except that it returns ctx itself (and a no-op cancel) when ctx's own
// deadline comes first: the worker sends with a context bounded by its
// send timeout and the reminder's deadline, and a child context with a
// later deadline would bound nothing more, yet cost a timer and four
// allocations per send.
func WithTimeout(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= timeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, timeout)
}
