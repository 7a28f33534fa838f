package worker

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"errors"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

var (
	t0   = time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)
	topo = broker.Topology{RetryTiers: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute}}.WithDefaults()
	// policy: 1 s doubling to 1 min, five attempts.
	policy = retryPolicy{maxAttempts: 5, base: time.Second, max: time.Minute, topo: topo}
)

func at(d time.Duration) time.Time { return t0.Add(d) }

// row is an SMS reminder row at fence 7, due a second ago, deadline in an hour.
func row(mod func(*store.Delivery)) store.Delivery {
	r := store.Delivery{ID: 42, Tenant: "acme", Channel: reminder.SMS, State: reminder.Enqueued, Fence: 7, DueAt: at(-time.Second), Deadline: at(time.Hour)}
	if mod != nil {
		mod(&r)
	}
	return r
}

func sms(id int64) message.Envelope {
	return message.Envelope{ReminderID: id, Fence: 7, Channel: "sms"}
}

var (
	http503 = provider.RetryableError("http_503", 0, errors.New("unavailable"))
	http429 = provider.RetryableError("http_429", 20*time.Second, errors.New("slow down"))
	http400 = provider.PermanentError("http_400", errors.New("bad number"))
	// http429Long asks for longer than topo's longest retry tier (2 min).
	http429Long = provider.RetryableError("http_429", 10*time.Minute, errors.New("slow down"))
)

// TestDecisions runs every decision the worker takes about a message, one
// row per situation, without a database, a broker or a clock.
func TestDecisions(t *testing.T) {
	t.Parallel()
	grant := ratelimit.Grant{Slots: []time.Time{at(100 * time.Millisecond), at(200 * time.Millisecond)},
		NextAt: at(time.Second), QueueAt: at(2 * time.Second), Spacing: 500 * time.Millisecond}
	// In service order: two granted, then two that waited before (the second
	// too close to its deadline for its turn), then two new ones.
	allotted := allot(grant, []waiting{
		{notBefore: at(-time.Second), deadline: at(time.Hour)},
		{notBefore: at(-time.Millisecond), deadline: at(time.Hour)},
		{notBefore: at(0), deadline: at(time.Hour)},
		{notBefore: at(0), deadline: at(1500 * time.Millisecond)},
		{deadline: at(time.Hour)},
		{deadline: at(time.Hour)},
	})
	unlimited := allot(ratelimit.Grant{Unlimited: true}, []waiting{{deadline: at(time.Hour)}, {deadline: at(time.Hour)}})
	notSent := verdict{kind: kindExpire, transition: reminder.CodeDeadlineBeforeSend, attempt: reminder.OutcomeNotSent, err: "not sent"}
	deadlineReached, withinMargin := notSent, notSent
	deadlineReached.reason, deadlineReached.code = "deadline reached before the send started", "deadline"
	withinMargin.reason, withinMargin.code = "deadline within the send margin (300ms) before the send started", "deadline_margin"

	for _, tc := range []struct {
		name      string
		got, want verdict
	}{
		// On receipt, before the row is read.
		{"receive: a signature that does not verify",
			onReceive(errors.New("bad signature"), message.Envelope{}, reminder.SMS, 0, 4),
			verdict{kind: kindDeadLetter, code: codeUnverifiable, reason: "unverifiable: bad signature"}},
		{"receive: an email message on the sms queue",
			onReceive(nil, message.Envelope{Channel: "email"}, reminder.SMS, 0, 4),
			verdict{kind: kindDeadLetter, code: codeWrongChannel, reason: `wrong channel "email" on the sms queue`}},
		{"receive: delivered as often as the poison limit before",
			onReceive(nil, sms(1), reminder.SMS, 4, 4),
			verdict{kind: kindQuarantine, code: codePoison, reason: "delivered 5 times without an outcome"}},
		{"receive: redelivered, under the poison limit",
			onReceive(nil, sms(1), reminder.SMS, 3, 4), verdict{kind: kindProceed}},

		// Against the row, as read at t0.
		{"row: none", onRow(store.Delivery{}, false, 7, reminder.SMS, t0), verdict{kind: kindDeadLetter, code: codeUnknownReminder, reason: "unknown reminder"}},
		{"row: of another channel (a signed sms message naming an email reminder)",
			onRow(row(func(r *store.Delivery) { r.Channel = reminder.Email }), true, 7, reminder.SMS, t0),
			verdict{kind: kindDeadLetter, code: codeWrongChannel, reason: `reminder 42 is of channel "email", not sms`}},
		{"row: of another channel, terminal",
			onRow(row(func(r *store.Delivery) { r.Channel, r.State = reminder.Email, reminder.Delivered }), true, 7, reminder.SMS, t0),
			verdict{kind: kindDeadLetter, code: codeWrongChannel, reason: `reminder 42 is of channel "email", not sms`}},
		{"row: canceled", onRow(row(func(r *store.Delivery) { r.State = reminder.Canceled }), true, 7, reminder.SMS, t0),
			verdict{kind: kindDiscard, code: metrics.DupSuperseded}},
		{"row: expired", onRow(row(func(r *store.Delivery) { r.State = reminder.Expired }), true, 7, reminder.SMS, t0),
			verdict{kind: kindDiscard, code: metrics.DupSuperseded}},
		{"row: delivered by an earlier delivery", onRow(row(func(r *store.Delivery) { r.State = reminder.Delivered }), true, 7, reminder.SMS, t0),
			verdict{kind: kindDiscard, code: metrics.DupConsume}},
		{"row: a newer fence", onRow(row(func(r *store.Delivery) { r.Fence = 8 }), true, 7, reminder.SMS, t0),
			verdict{kind: kindDiscard, code: metrics.DupConsume}},
		{"row: exactly at its deadline", onRow(row(func(r *store.Delivery) { r.Deadline = t0 }), true, 7, reminder.SMS, t0),
			verdict{kind: kindExpire, reason: "deadline reached before the send started", code: "deadline"}},
		{"row: past its deadline and not due (the deadline wins)",
			onRow(row(func(r *store.Delivery) { r.Deadline, r.DueAt = at(-time.Second), at(time.Minute) }), true, 7, reminder.SMS, t0),
			verdict{kind: kindExpire, reason: "deadline reached before the send started", code: "deadline"}},
		{"row: not due yet", onRow(row(func(r *store.Delivery) { r.DueAt = at(time.Minute) }), true, 7, reminder.SMS, t0),
			verdict{kind: kindDefer, at: at(time.Minute)}},
		{"row: due exactly now", onRow(row(func(r *store.Delivery) { r.DueAt = t0 }), true, 7, reminder.SMS, t0), verdict{kind: kindClaim}},
		{"row: retrying and due", onRow(row(func(r *store.Delivery) { r.State = reminder.Retrying }), true, 7, reminder.SMS, t0),
			verdict{kind: kindClaim}},
		{"row: retrying, its next attempt reached", onRow(row(func(r *store.Delivery) { r.State, r.NextAttemptAt = reminder.Retrying, t0 }), true, 7, reminder.SMS, t0),
			verdict{kind: kindClaim}},
		// Issue 13, finding 8: a retry message replayed (or back from a
		// tier shorter than its Retry-After) was sent at once.
		{"row: retrying before its next attempt (a replayed retry)",
			onRow(row(func(r *store.Delivery) { r.State, r.NextAttemptAt = reminder.Retrying, at(10*time.Minute) }), true, 7, reminder.SMS, t0),
			verdict{kind: kindDefer, at: at(10 * time.Minute)}},
		{"row: enqueued with a stale next attempt time", onRow(row(func(r *store.Delivery) { r.NextAttemptAt = at(time.Minute) }), true, 7, reminder.SMS, t0),
			verdict{kind: kindClaim}},
		{"claim: the row moved on under the claim", lostClaim(), verdict{kind: kindDiscard, code: metrics.DupClaim}},

		// Before asking the limiter.
		{"ask: new", beforeAsking(time.Time{}, t0, topo), verdict{kind: kindProceed}},
		{"ask: turn under the shortest tier away", beforeAsking(at(999*time.Millisecond), t0, topo), verdict{kind: kindProceed}},
		{"ask: turn a tier away", beforeAsking(at(time.Second), t0, topo), verdict{kind: kindHop, at: at(time.Second)}},

		// From the limiter's grant.
		{"grant: first slot", allotted[0], verdict{kind: kindSend, at: at(100 * time.Millisecond)}},
		{"grant: second slot", allotted[1], verdict{kind: kindSend, at: at(200 * time.Millisecond)}},
		{"grant: waited, first without a slot: the flow's next turn", allotted[2], verdict{kind: kindWaitTurn, at: at(time.Second)}},
		{"grant: waited, its turn at its deadline", allotted[3],
			verdict{kind: kindExpireEarly, reason: "rate_limited: no capacity before the deadline", code: "rate_limited"}},
		{"grant: new, first without a slot: the queue's turn", allotted[4], verdict{kind: kindWaitTurn, at: at(2 * time.Second)}},
		{"grant: new, second: one spacing later", allotted[5], verdict{kind: kindWaitTurn, at: at(2500 * time.Millisecond)}},
		{"grant: unlimited sends at once", unlimited[1], verdict{kind: kindSend}},

		// A claimed attempt that missed its slot and got none in time.
		{"slot missed: time for a retry", onSlotMissed(t0, at(time.Hour), time.Second),
			verdict{kind: kindRetry, at: at(time.Second), reason: "rate_limited: send slot missed; retrying", code: "slot_missed",
				transition: reminder.CodeRetry, attempt: reminder.OutcomeNotSent, err: "not sent: no rate-limit slot in time"}},
		{"slot missed: the retry would come at the deadline", onSlotMissed(t0, at(time.Second), time.Second),
			verdict{kind: kindExpire, reason: "rate_limited: no capacity before the deadline", code: "slot_missed",
				transition: reminder.CodeNoCapacity, attempt: reminder.OutcomeNotSent, err: "not sent: no rate-limit slot in time"}},

		// When the provider call would start (the last moment: after every
		// wait, and again right before the request leaves), with a margin.
		{"send: no margin, a nanosecond before the deadline", beforeSend(t0, at(time.Nanosecond), 0), verdict{kind: kindSend}},
		{"send: no margin, at the deadline", beforeSend(t0, t0, 0), deadlineReached},
		{"send: the deadline a nanosecond past the margin", beforeSend(t0, at(300*time.Millisecond+time.Nanosecond), 300*time.Millisecond),
			verdict{kind: kindSend}},
		{"send: the deadline exactly at the margin", beforeSend(t0, at(300*time.Millisecond), 300*time.Millisecond), withinMargin},
		{"send: the deadline inside the margin", beforeSend(t0, at(time.Millisecond), 300*time.Millisecond), withinMargin},
		{"send: at the deadline, with a margin", beforeSend(t0, t0, 300*time.Millisecond), deadlineReached},
		{"send: past the deadline, with a margin", beforeSend(at(time.Second), t0, 300*time.Millisecond), deadlineReached},

		// From the provider's answer, at t0.
		{"answer: accepted", onAnswer(nil, 1, t0, at(time.Hour), policy, 0),
			verdict{kind: kindDelivered, reason: "delivered", code: "delivered", transition: reminder.CodeDelivered, attempt: reminder.OutcomeDelivered}},
		{"answer: permanent", onAnswer(http400, 1, t0, at(time.Hour), policy, 0),
			verdict{kind: kindFail, reason: "permanent failure: http_400", code: "http_400", transition: reminder.CodePermanentFailure, attempt: reminder.OutcomePermanent, err: http400.Error()}},
		{"answer: retryable on the last attempt", onAnswer(http503, 5, t0, at(time.Hour), policy, 0),
			verdict{kind: kindFail, reason: "attempts exhausted (5): http_503", code: "http_503", transition: reminder.CodeAttemptsExhausted, attempt: reminder.OutcomeRetryable, err: http503.Error()}},
		{"answer: retryable, first attempt: 0.5 s rounds up to the 1 s tier", onAnswer(http503, 1, t0, at(time.Hour), policy, 0),
			verdict{kind: kindRetry, at: at(time.Second), reason: "retry 1 in 1s: http_503", code: "http_503", transition: reminder.CodeRetry, attempt: reminder.OutcomeRetryable, err: http503.Error()}},
		{"answer: retryable, third attempt, mid jitter: 3 s rounds up to 5 s", onAnswer(http503, 3, t0, at(time.Hour), policy, 0.5),
			verdict{kind: kindRetry, at: at(5 * time.Second), reason: "retry 3 in 5s: http_503", code: "http_503", transition: reminder.CodeRetry, attempt: reminder.OutcomeRetryable, err: http503.Error()}},
		{"answer: Retry-After longer than the backoff wins", onAnswer(http429, 1, t0, at(time.Hour), policy, 0),
			verdict{kind: kindRetry, at: at(30 * time.Second), reason: "retry 1 in 30s: http_429", code: "http_429", transition: reminder.CodeRetry, attempt: reminder.OutcomeRetryable, err: http429.Error()}},
		{"answer: Retry-After longer than the longest tier is kept whole", onAnswer(http429Long, 1, t0, at(time.Hour), policy, 0),
			verdict{kind: kindRetry, at: at(10 * time.Minute), reason: "retry 1 in 10m0s: http_429", code: "http_429",
				transition: reminder.CodeRetry, attempt: reminder.OutcomeRetryable, err: http429Long.Error()}},
		{"answer: the retry would come at the deadline", onAnswer(http503, 1, t0, at(time.Second), policy, 0),
			verdict{kind: kindExpire, reason: "deadline would pass before the next attempt: http_503", code: "http_503", transition: reminder.CodeDeadlineBeforeRetry, attempt: reminder.OutcomeRetryable, err: http503.Error()}},
		{"answer: an unclassified error is retryable", onAnswer(errors.New("connection reset"), 1, t0, at(time.Hour), policy, 0),
			verdict{kind: kindRetry, at: at(time.Second), reason: "retry 1 in 1s: unknown", code: "unknown", transition: reminder.CodeRetry, attempt: reminder.OutcomeUnknown,
				err: provider.Classify(errors.New("connection reset")).Error()}},
		{"answer: the adapter panicked", onPanic("index out of range"),
			verdict{kind: kindQuarantine, reason: "quarantined: the send panicked: index out of range", code: "panic",
				transition: reminder.CodeSendPanicked, attempt: reminder.OutcomePanicked, err: "panic: index out of range"}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s:\n got  %v\n want %v", tc.name, tc.got, tc.want)
		}
	}
}

// night is a window closed at t0 (09:00 UTC).
func night() localtime.Window {
	w, _ := localtime.ParseWindow("21:00-08:00")
	return w
}

// Every kind of verdict is reachable from some decision, and each that ends
// an attempt records a state.
func TestEveryVerdictKindIsDecided(t *testing.T) {
	t.Parallel()
	decided := map[kind]bool{}
	for _, v := range []verdict{
		onReceive(nil, sms(1), reminder.SMS, 0, 4),
		onReceive(errors.New("x"), message.Envelope{}, reminder.SMS, 0, 4),
		onReceive(nil, sms(1), reminder.SMS, 9, 4),
		lostClaim(),
		onRow(row(nil), true, 7, reminder.SMS, t0),
		onRow(row(nil), true, 7, reminder.SMS, at(2*time.Hour)),
		onRow(row(func(r *store.Delivery) { r.DueAt = at(time.Minute) }), true, 7, reminder.SMS, t0),
		beforeAsking(at(time.Minute), t0, topo),
		beforeSend(t0, at(time.Hour), time.Second),
		onAnswer(nil, 1, t0, at(time.Hour), policy, 0),
		onAnswer(http503, 1, t0, at(time.Hour), policy, 0),
		onAnswer(http400, 1, t0, at(time.Hour), policy, 0),
		windowBeforeClaim(night(), time.UTC, t0, at(24*time.Hour)),
		windowBeforeClaim(night(), time.UTC, t0, at(time.Hour)),
	} {
		decided[v.kind] = true
	}
	for _, v := range allot(ratelimit.Grant{QueueAt: at(time.Minute)}, []waiting{{deadline: at(time.Hour)}, {deadline: at(time.Second)}}) {
		decided[v.kind] = true
	}
	for k := range kind(len(kindNames)) {
		if !decided[k] {
			t.Errorf("no decision returns %s", k)
		}
	}
}

// Every verdict that ends an attempt names a transition the table allows
// from sending, to the state its kind means, and says how the attempt ended.
func TestAttemptVerdictsFollowTheTransitionTable(t *testing.T) {
	t.Parallel()
	want := map[kind]reminder.State{kindDelivered: reminder.Delivered, kindRetry: reminder.Retrying,
		kindFail: reminder.Failed, kindExpire: reminder.Expired, kindQuarantine: reminder.Quarantined}
	for _, v := range []verdict{
		onSlotMissed(t0, at(time.Hour), time.Second),
		onSlotMissed(t0, at(time.Millisecond), time.Second),
		beforeSend(t0, t0, 0),
		beforeSend(t0, at(time.Millisecond), time.Second),
		onAnswer(nil, 1, t0, at(time.Hour), policy, 0),
		onAnswer(http503, 1, t0, at(time.Hour), policy, 0),
		onAnswer(http503, 5, t0, at(time.Hour), policy, 0),
		onAnswer(http503, 1, t0, at(time.Millisecond), policy, 0),
		onAnswer(http400, 1, t0, at(time.Hour), policy, 0),
		onPanic("boom"),
	} {
		got, err := reminder.Target(reminder.Worker, v.transition, reminder.Sending)
		if err != nil || got != want[v.kind] {
			t.Errorf("%s: transition %q from sending: got %q (%v), want %q", v, v.transition, got, err, want[v.kind])
		}
		if v.attempt == "" {
			t.Errorf("%s: no attempt outcome", v)
		}
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		attempt    int
		retryAfter time.Duration
		jitter     float64
		base, max  time.Duration
		want       time.Duration
	}{
		{attempt: 1, jitter: 0, want: 500 * time.Millisecond},
		{attempt: 1, jitter: 0.5, want: 750 * time.Millisecond},
		{attempt: 2, jitter: 0, want: time.Second},
		{attempt: 4, jitter: 0.25, want: 5 * time.Second},                                   // 8 s: 4 s + 1 s
		{attempt: 10, jitter: 0, want: 30 * time.Second},                                    // capped at 1 min, halved
		{attempt: 10, jitter: 0.999999, want: 59999970 * time.Microsecond},                  // just under the cap
		{attempt: 3, base: time.Minute, max: 2 * time.Minute, jitter: 0, want: time.Minute}, // 4 min: the cap
		{attempt: 1, retryAfter: 20 * time.Second, want: 20 * time.Second},
	} {
		p := policy
		if tc.base != 0 {
			p.base, p.max = tc.base, tc.max
		}
		if got := p.backoff(tc.attempt, tc.retryAfter, tc.jitter); got != tc.want {
			t.Errorf("backoff(attempt %d, retry-after %s, jitter %v) with base %s max %s = %s, want %s",
				tc.attempt, tc.retryAfter, tc.jitter, p.base, p.max, got, tc.want)
		}
	}
}

func TestServiceOrder(t *testing.T) {
	t.Parallel()
	got := serviceOrder([]waiting{{}, {notBefore: at(2 * time.Second)}, {}, {notBefore: at(time.Second)}})
	want := []int{3, 1, 0, 2}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("serviceOrder = %v, want %v: waited first, earliest turn first, then new in arrival order", got, want)
		}
	}
}

// The delivery count is the broker's: a header on a delivery the broker
// does not flag as redelivered came from the publisher.
func TestDeliveryCountIsTheBrokers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		d    amqp.Delivery
		want int64
	}{
		{"first delivery, no header", amqp.Delivery{}, 0},
		{"first delivery, forged header", amqp.Delivery{Headers: amqp.Table{"x-delivery-count": int64(50)}}, 0},
		{"redelivered, the queue's count", amqp.Delivery{Redelivered: true, Headers: amqp.Table{"x-delivery-count": int64(3)}}, 3},
		{"redelivered, int32", amqp.Delivery{Redelivered: true, Headers: amqp.Table{"x-delivery-count": int32(2)}}, 2},
		{"redelivered, no header (classic queue)", amqp.Delivery{Redelivered: true}, 0},
	} {
		if got := deliveryCount(tc.d); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
}
