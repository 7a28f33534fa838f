package reminder

import (
	"fmt"
	"slices"
	"strings"
	"sync"
)

// None stands for "no row": the state before a reminder is scheduled and
// after retention deletes it. It is never stored.
const None State = ""

// Actor is the kind of component that takes a transition. The events record
// the login or process name of the writer; the kind is what the table allows.
type Actor string

// The kinds of writer.
const (
	// Intake records and changes intent: pkg/intake, the SQL functions
	// nudge_schedule, nudge_cancel, nudge_cancel_prefix, nudge_reschedule,
	// nudge_reschedule_to and nudge_update, and nudgectl schedule, cancel,
	// reschedule and update.
	Intake Actor = "intake"
	// Dispatcher claims due rows and publishes them.
	Dispatcher Actor = "dispatcher"
	// Worker claims attempts, sends and records outcomes.
	Worker Actor = "worker"
	// Reconciler repairs from the table: deadlines, dispatch leases, lost messages.
	Reconciler Actor = "reconciler"
	// Operator decides with nudgectl replay and dlq replay/expire.
	Operator Actor = "operator"
	// Retention deletes terminal rows once their window has passed.
	Retention Actor = "retention"
)

// Code says why a transition happened, for machines: every event carries
// one (reminder_events.code, from schema version 9), and the human-readable
// reason beside it is free text. Statistics and alerts match codes, never
// reason text.
type Code string

// Reason codes. Each names one or more rows of Transitions.
const (
	CodeScheduled   Code = "scheduled"
	CodeCanceled    Code = "canceled"
	CodeRescheduled Code = "rescheduled"
	CodeUpdated     Code = "updated"

	CodeClaimed                Code = "claimed"
	CodeDeadlineBeforeDispatch Code = "deadline_before_dispatch"
	CodePublishNotConfirmed    Code = "publish_not_confirmed"
	CodePublishConfirmed       Code = "publish_confirmed"

	CodeAttemptClaimed      Code = "attempt_claimed"
	CodeDeadlineBeforeSend  Code = "deadline_before_send"
	CodeNoCapacity          Code = "no_capacity"
	CodePoisonMessage       Code = "poison_message"
	CodeDelivered           Code = "delivered"
	CodeRetry               Code = "retry"
	CodePermanentFailure    Code = "permanent_failure"
	CodeAttemptsExhausted   Code = "attempts_exhausted"
	CodeDeadlineBeforeRetry Code = "deadline_before_retry"
	CodeSendPanicked        Code = "send_panicked"
	// CodeFoundAtProvider: an earlier attempt whose outcome was unknown is
	// found at the provider (a lookup), so the reminder is delivered
	// without another send.
	CodeFoundAtProvider Code = "found_at_provider"
	// CodeSettledByLookup: at or past the deadline, the reconciler asked
	// the provider about an attempt whose outcome was unknown, and the
	// provider holds its message: delivered, settled by lookup.
	CodeSettledByLookup Code = "settled_by_lookup"

	// CodeWindowClosed: the send window was closed when the reminder was
	// due (dispatcher: it stays pending, due at the next opening) or about to
	// be sent (worker: retried at the next opening).
	CodeWindowClosed Code = "window_closed"
	// CodeNoWindowBeforeDeadline: the send window does not open again
	// before the deadline (localtime.ReasonNoWindow).
	CodeNoWindowBeforeDeadline Code = "no_window_before_deadline"

	CodeDeadlinePassed       Code = "deadline_passed"
	CodeDispatchLeaseExpired Code = "dispatch_lease_expired"
	CodeRepublished          Code = "republished"
	CodeSendLeaseExpired     Code = "send_lease_expired"
	CodeRepublishLimit       Code = "republish_limit"

	CodeReplayed    Code = "replayed"
	CodeDLQReplayed Code = "dlq_replayed"
	CodeDLQExpired  Code = "dlq_expired"

	CodeDeleted Code = "deleted"
)

// Transition is one allowed move of a reminder: from one state to another
// (None for "no row"), by one kind of writer, for one reason.
type Transition struct {
	From, To State
	Actor    Actor
	Code     Code
	// Statement names where it is made: a statement of a .sql file, or a
	// SQL function of the migrations.
	Statement string
	// Legacy transitions are made only by binaries of schema version 6 and
	// earlier, which may still run during a rollout; no statement of this
	// version makes them.
	Legacy bool
	// Folded names the slot of the reminder's row (schema version 30) that
	// holds this transition's event instead of a reminder_events row, when
	// it is the happy path's move and the slot is empty: the reminder's
	// first claim, first attempt, its delivery. Empty: always an event row.
	// Readers see both through the view reminder_timeline.
	Folded string
	// Doc says when, in a few words.
	Doc string
}

func (t Transition) String() string {
	return fmt.Sprintf("%s → %s by %s (%s)", show(t.From), show(t.To), t.Actor, t.Code)
}

func show(s State) string {
	if s == None {
		return "(none)"
	}
	return string(s)
}

// open are the states a reminder waits in without a send in flight.
var open = []State{Pending, Leased, Enqueued, Retrying, Quarantined}

// claimable are the states a worker's message may claim an attempt from.
var claimable = []State{Leased, Enqueued, Retrying}

var terminal = []State{Delivered, Failed, Expired, Canceled}

// each returns one transition per from state, the rest alike.
func each(froms []State, t Transition) []Transition {
	out := make([]Transition, len(froms))
	for i, f := range froms {
		out[i] = t
		out[i].From = f
	}
	return out
}

// foldFrom marks the transition of ts from one state as folded into slot.
func foldFrom(from State, slot string, ts []Transition) []Transition {
	for i := range ts {
		if ts[i].From == from {
			ts[i].Folded = slot
		}
	}
	return ts
}

// Transitions is every move a reminder may make, and the only place that
// says so. Every statement that writes reminders is checked against it
// (schema/transitions_test.go runs each from every state), and the table in
// docs/design.md is generated from it (TransitionsMarkdown).
var Transitions = slices.Concat(
	[]Transition{
		{From: None, To: Pending, Actor: Intake, Code: CodeScheduled, Statement: "ScheduleMany, nudge_try_schedule",
			Doc: "intent recorded (a repeat of the same key and content changes nothing)"},
	},
	each(open, Transition{To: Canceled, Actor: Intake, Code: CodeCanceled, Statement: "nudge_cancel, nudge_cancel_prefix",
		Doc: "the application or an operator cancels, by key or by key prefix; never while sending"}),
	each(open, Transition{To: Pending, Actor: Intake, Code: CodeRescheduled, Statement: "nudge_reschedule, nudge_reschedule_to, nudge_reschedule_window",
		Doc: "new due time and deadline, under a new fence; never while sending"}),
	each(open, Transition{To: Pending, Actor: Intake, Code: CodeUpdated, Statement: "nudge_update",
		Doc: "new content (recipient, template, data) under a new fence, times kept: a queued message of the old content is discarded; never while sending"}),
	[]Transition{
		{From: Pending, To: Enqueued, Actor: Dispatcher, Code: CodeClaimed, Statement: "ClaimDue",
			Folded: "claimed_at, claimed_fence, claimed_by (the first claim)",
			Doc:    "due before the run's cutoff: dispatch lease and batch number, then published"},
		{From: Pending, To: Expired, Actor: Dispatcher, Code: CodeDeadlineBeforeDispatch, Statement: "ClaimDue, ExpireDue",
			Doc: "due, but its deadline passed before it was claimed"},
		{From: Pending, To: Pending, Actor: Dispatcher, Code: CodeWindowClosed, Statement: "ClaimDue",
			Doc: "due, but its send window is closed: due again at the next opening (docs/local-time.md)"},
		{From: Pending, To: Expired, Actor: Dispatcher, Code: CodeNoWindowBeforeDeadline, Statement: "ClaimDue",
			Doc: "due, its send window closed, and the next opening is at or after the deadline"},
		{From: Pending, To: Leased, Actor: Dispatcher, Code: CodeClaimed, Legacy: true,
			Doc: "the claim of a dispatcher before schema version 7"},
		{From: Leased, To: Enqueued, Actor: Dispatcher, Code: CodePublishConfirmed, Legacy: true,
			Doc: "publish confirmed, row by row, by a dispatcher before schema version 7"},
	},
	each([]State{Leased, Enqueued}, Transition{To: Pending, Actor: Dispatcher, Code: CodePublishNotConfirmed,
		Statement: "Release", Doc: "the broker did not confirm the publish; claimed again next run"}),
	each([]State{Leased, Enqueued}, Transition{To: Pending, Actor: Reconciler, Code: CodePublishNotConfirmed,
		Statement: "Release", Doc: "a republish the broker did not confirm"}),
	foldFrom(Enqueued, "started_at, started_fence, started_by (the first attempt)",
		each(claimable, Transition{To: Sending, Actor: Worker, Code: CodeAttemptClaimed, Statement: "ClaimForDelivery",
			Doc: "the message's fence is current, the row due and before its deadline: a send lease and an attempt"})),
	each(claimable, Transition{To: Expired, Actor: Worker, Code: CodeDeadlineBeforeSend, Statement: "SettleQueued",
		Doc: "the deadline is reached before the send started (ExpireFenced)"}),
	each(claimable, Transition{To: Expired, Actor: Worker, Code: CodeNoCapacity, Statement: "SettleQueued",
		Doc: "no rate-limit capacity before the deadline (ExpireEarly)"}),
	each(claimable, Transition{To: Expired, Actor: Worker, Code: CodeNoWindowBeforeDeadline, Statement: "SettleQueued",
		Doc: "its send window is closed and does not open again before the deadline (ExpireNoWindow)"}),
	each(claimable, Transition{To: Quarantined, Actor: Worker, Code: CodePoisonMessage, Statement: "SettleQueued",
		Doc: "the message keeps failing its consumer: dead-lettered, parked for an operator (Quarantine)"}),
	[]Transition{
		{From: Sending, To: Delivered, Actor: Worker, Code: CodeDelivered, Statement: "RecordOutcomes",
			Folded: "delivered_by, with the row's fence, finished_at and reason", Doc: "the provider accepted"},
		{From: Sending, To: Retrying, Actor: Worker, Code: CodeRetry, Statement: "RecordOutcomes",
			Doc: "a retryable failure (or a missed send slot): a retry message waits in a tier"},
		{From: Sending, To: Failed, Actor: Worker, Code: CodePermanentFailure, Statement: "RecordOutcomes",
			Doc: "a permanent failure (4xx, bad address, unknown template)"},
		{From: Sending, To: Failed, Actor: Worker, Code: CodeAttemptsExhausted, Statement: "RecordOutcomes",
			Doc: "a retryable failure of the last attempt allowed"},
		{From: Sending, To: Expired, Actor: Worker, Code: CodeDeadlineBeforeRetry, Statement: "RecordOutcomes",
			Doc: "a retryable failure, and the next attempt would start at or after the deadline"},
		{From: Sending, To: Expired, Actor: Worker, Code: CodeDeadlineBeforeSend, Statement: "RecordOutcomes",
			Doc: "the deadline was reached, or came within the deadline margin, between the claim and the request leaving (nothing sent)"},
		{From: Sending, To: Expired, Actor: Worker, Code: CodeNoCapacity, Statement: "RecordOutcomes",
			Doc: "the send slot was missed and no capacity is left before the deadline (nothing sent)"},
		{From: Sending, To: Retrying, Actor: Worker, Code: CodeWindowClosed, Statement: "RecordOutcomes",
			Doc: "the send window closed between the claim and the send (a slot wait): retried at the next opening (nothing sent)"},
		{From: Sending, To: Expired, Actor: Worker, Code: CodeNoWindowBeforeDeadline, Statement: "RecordOutcomes",
			Doc: "the send window closed before the send, and does not open again before the deadline (nothing sent)"},
		{From: Sending, To: Quarantined, Actor: Worker, Code: CodeSendPanicked, Statement: "RecordOutcomes",
			Doc: "the send panicked: parked for an operator"},
		{From: Sending, To: Delivered, Actor: Worker, Code: CodeFoundAtProvider, Statement: "RecordOutcomes",
			Doc: "an earlier attempt's outcome was unknown and the provider has its message: not sent again"},
	},
	each(claimable, Transition{To: Delivered, Actor: Worker, Code: CodeFoundAtProvider, Statement: "SettleQueued",
		Doc: "the deadline is reached, and the provider has the message of an earlier attempt whose outcome was unknown (FoundAtProvider)"}),
	each(append(slices.Clone(open), Sending), Transition{To: Delivered, Actor: Reconciler, Code: CodeSettledByLookup,
		Statement: "SettledByLookup", Doc: "at or past the deadline with an attempt of unknown outcome, and its provider holds the message (sending only once its send lease expired)"}),
	each(append(slices.Clone(open), Sending), Transition{To: Expired, Actor: Reconciler, Code: CodeDeadlinePassed,
		Statement: "ExpireOverdue", Doc: "at or past the deadline (sending only once its send lease expired)"}),
	each([]State{Leased, Enqueued}, Transition{To: Pending, Actor: Reconciler, Code: CodeDispatchLeaseExpired,
		Statement: "ResolveExpiredLeases", Doc: "the dispatch lease ran out with no publish confirmation for its batch"}),
	each([]State{Enqueued, Retrying}, Transition{To: Enqueued, Actor: Reconciler, Code: CodeRepublished,
		Statement: "Reclaim", Doc: "its message is overdue, presumed lost: claimed again and republished"}),
	[]Transition{
		{From: Sending, To: Enqueued, Actor: Reconciler, Code: CodeSendLeaseExpired, Statement: "Reclaim",
			Doc: "its worker died mid-send: republished with the same idempotency key"},
	},
	each([]State{Enqueued, Retrying, Sending}, Transition{To: Quarantined, Actor: Reconciler, Code: CodeRepublishLimit,
		Statement: "Reclaim", Doc: "republished MaxRepublishes times without an outcome"}),
	each([]State{Failed, Quarantined, Leased, Enqueued, Retrying}, Transition{To: Pending, Actor: Operator,
		Code: CodeReplayed, Statement: "Replay", Doc: "controlled replay (open states only once stuck)"}),
	each([]State{Quarantined, Enqueued, Retrying}, Transition{To: Pending, Actor: Operator, Code: CodeDLQReplayed,
		Statement: "DLQReplay", Doc: "an operator replays its dead letter (enqueued, retrying: the only copy of its message)"}),
	each([]State{Quarantined, Enqueued, Retrying}, Transition{To: Expired, Actor: Operator, Code: CodeDLQExpired,
		Statement: "DLQExpire", Doc: "an operator expires its dead letter (enqueued, retrying: the only copy of its message)"}),
	each(terminal, Transition{To: None, Actor: Retention, Code: CodeDeleted, Statement: "DeleteReminders",
		Doc: "finished longer ago than the retention window (no event: the trail outlives the row)"}),
)

// Allowed reports whether a writer of kind a may move a reminder from one
// state to another, for any reason.
func Allowed(from, to State, a Actor) bool {
	return slices.ContainsFunc(Transitions, func(t Transition) bool {
		return t.From == from && t.To == to && t.Actor == a
	})
}

// Lookup returns the transition from a state, by a kind of writer, for a
// reason: where the code leads (legacy rows aside). False when the table has
// none.
func Lookup(from State, a Actor, c Code) (Transition, bool) {
	i, ok := lookupIndex()[lookupKey{from, a, c}]
	if !ok {
		return Transition{}, false
	}
	return Transitions[i], true
}

type lookupKey struct {
	from  State
	actor Actor
	code  Code
}

// lookupIndex is Lookup's answers, the first transition of the table that
// is not legacy for each state, kind of writer and code, built once: the
// worker asks for each outcome it records, and a scan of the table was
// 1.5% of its CPU profile. Transitions is never changed after init.
var lookupIndex = sync.OnceValue(func() map[lookupKey]int {
	idx := make(map[lookupKey]int, len(Transitions))
	for i, t := range Transitions {
		k := lookupKey{t.From, t.Actor, t.Code}
		if _, seen := idx[k]; !t.Legacy && !seen {
			idx[k] = i
		}
	}
	return idx
})

// Target returns the state code c leads a writer of kind a to from any of
// froms, which must agree on it; an error names a code the table does not
// allow from one of them.
func Target(a Actor, c Code, froms ...State) (State, error) {
	var to State
	for i, f := range froms {
		t, ok := Lookup(f, a, c)
		if !ok {
			return None, fmt.Errorf("no transition from %s by %s with code %q", show(f), a, c)
		}
		if i > 0 && t.To != to {
			return None, fmt.Errorf("code %q leads to %s from %s but to %s from %s", c, t.To, f, to, froms[0])
		}
		to = t.To
	}
	return to, nil
}

// Outcome is what one send attempt came to, as the worker records it on the
// attempt (delivery_attempts.result, from schema version 9). It says whether
// the recipient may have been reached, which the reason of a reminder that
// ends undelivered mentions; the reminder's next state is the transition's
// (Code), not the outcome's.
type Outcome string

// Attempt outcomes.
const (
	// OutcomeDelivered: the provider accepted the message.
	OutcomeDelivered Outcome = "delivered"
	// OutcomeRetryable: the provider answered "not now" (429, 5xx, a
	// deferral): nothing was delivered.
	OutcomeRetryable Outcome = "retryable"
	// OutcomeUnknown: no answer came (a timeout, a dropped connection, a
	// canceled or unclassified error): the provider may have accepted.
	OutcomeUnknown Outcome = "unknown"
	// OutcomeNotSent: the attempt never reached the provider (no send slot in
	// time, or the deadline came first).
	OutcomeNotSent Outcome = "not_sent"
	// OutcomePermanent: the provider refused for good (4xx, bad address) or
	// the message could not be built (unknown template).
	OutcomePermanent Outcome = "permanent"
	// OutcomePanicked: the send panicked.
	OutcomePanicked Outcome = "panicked"
)

// Outcomes lists every attempt outcome.
var Outcomes = []Outcome{OutcomeDelivered, OutcomeRetryable, OutcomeUnknown, OutcomeNotSent, OutcomePermanent, OutcomePanicked}

// Legacy is the coarse value of delivery_attempts.outcome that binaries
// before schema version 9 read and wrote: delivered, retryable or permanent.
func (o Outcome) Legacy() string {
	switch o {
	case OutcomeDelivered:
		return "delivered"
	case OutcomePermanent, OutcomePanicked:
		return "permanent"
	}
	return "retryable"
}

// Note is an event that is not a transition: something happened to a
// reminder's message that an operator should see in its timeline, but the
// reminder did not move. A note's event has from_state = to_state = the
// state the reminder was in, its fence unchanged, and one of these codes;
// statistics that count transitions by their states leave notes out
// (from_state = to_state), and schema/transitions_test.go does not take a
// note for a transition.
type Note struct {
	Code  Code
	Actor Actor
	// Statement names where it is written.
	Statement string
	Doc       string
}

// Note codes. None of them is a code of Transitions.
const (
	// CodeDeadLettered: a worker put a message naming the reminder in its
	// channel's dead-letter queue (the reason says why: unverifiable
	// fields aside, a wrong channel, a poison message, a panicked send).
	CodeDeadLettered Code = "dead_lettered"
	// CodeDLQDropped: an operator's dlq decision acknowledged (dropped) a
	// stale dead letter naming the reminder, which had already moved on.
	CodeDLQDropped Code = "dlq_dropped"
)

// Notes lists every note an event may record.
var Notes = []Note{
	{Code: CodeDeadLettered, Actor: Worker, Statement: "NoteEvents (internal/store)",
		Doc: "a worker dead-lettered a verified message naming the reminder, once the dead letter was confirmed (or rejected to the queue's dead-letter exchange)"},
	{Code: CodeDLQDropped, Actor: Operator, Statement: "NoteDropped (internal/ops)",
		Doc: "an operator's dlq replay or expire dropped a stale dead letter of the reminder"},
}

// IsNote reports whether c is the code of a note, not of a transition.
func IsNote(c Code) bool {
	return slices.ContainsFunc(Notes, func(n Note) bool { return n.Code == c })
}

// TransitionsMarkdown renders Transitions as the Markdown table of
// docs/design.md (a test keeps the two equal).
func TransitionsMarkdown() string {
	var b strings.Builder
	b.WriteString("| from | to | by | code | statement | when |\n|---|---|---|---|---|---|\n")
	for _, t := range Transitions {
		stmt := "`" + strings.ReplaceAll(t.Statement, ", ", "`, `") + "`"
		if t.Legacy {
			stmt = "(before version 7)"
		}
		doc := t.Doc
		if t.Folded != "" {
			doc += "; the event folded into the row: " + t.Folded
		}
		fmt.Fprintf(&b, "| %s | %s | %s | `%s` | %s | %s |\n", show(t.From), show(t.To), t.Actor, t.Code, stmt, doc)
	}
	return b.String()
}
