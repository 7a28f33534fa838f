package worker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func TestLookupDecisions(t *testing.T) {
	t.Parallel()
	undelivered := provider.PermanentError("twilio_30003", errors.New("undelivered"))
	tests := []struct {
		name string
		got  verdict
		want verdict
	}{
		{"found", onLookup("SM1", nil), verdict{kind: kindDelivered, transition: reminder.CodeFoundAtProvider,
			attempt: reminder.OutcomeDelivered, code: codeFound, reason: reasonFound + " (message SM1)"}},
		{"not found: send", onLookup("", fmt.Errorf("x: %w", provider.ErrNotFound)), verdict{kind: kindSend}},
		{"found failed for good", onLookup("", undelivered), verdict{kind: kindFail, transition: reminder.CodePermanentFailure,
			attempt: reminder.OutcomeNotSent, code: "twilio_30003", err: undelivered.Error(),
			reason: "permanent failure at the provider of an earlier attempt: twilio_30003"}},
		{"no answer: neither send nor conclude", onLookup("", http503), verdict{kind: kindProceed, code: "lookup_http_503",
			err: http503.Error()}},
		{"no answer: retried without a send", onLookupFailed(onLookup("", http503), 2, t0, at(time.Hour), policy, 0),
			verdict{kind: kindRetry, at: at(time.Second), transition: reminder.CodeRetry, attempt: reminder.OutcomeNotSent,
				code: "lookup_http_503", err: "retryable send failure (lookup_http_503): " + http503.Error(),
				reason: "retry 2 in 1s: lookup_http_503"}},
		{"no answer at the last attempt", onLookupFailed(onLookup("", http503), 5, t0, at(time.Hour), policy, 0),
			verdict{kind: kindFail, transition: reminder.CodeAttemptsExhausted, attempt: reminder.OutcomeNotSent,
				code: "lookup_http_503", err: "retryable send failure (lookup_http_503): " + http503.Error(),
				reason: "attempts exhausted (5): lookup_http_503"}},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, tt.got, "%s:\n got %s\nwant %s", tt.name, tt.got, tt.want)
	}

	timeout := provider.RetryableError("timeout", 0, context.DeadlineExceeded)
	for _, tt := range []struct {
		name string
		v    verdict
		want bool
	}{
		{"unknown, expiring", onAnswer(timeout, 1, t0, at(time.Second), policy, 0), true},
		{"unknown, attempts exhausted", onAnswer(timeout, 5, t0, at(time.Hour), policy, 0), true},
		{"unknown, retried: the next attempt asks", onAnswer(timeout, 1, t0, at(time.Hour), policy, 0), false},
		{"known, expiring", onAnswer(http503, 1, t0, at(time.Second), policy, 0), false},
		{"delivered", onAnswer(nil, 1, t0, at(time.Hour), policy, 0), false},
	} {
		require.Equal(t, tt.want, afterUnknown(tt.v), tt.name)
	}
}

// lookingSender is a scriptedSender that is also a provider.Looker.
type lookingSender struct {
	*scriptedSender
	found   map[int64]string // reminder → provider id found
	fail    map[int64]error  // reminder → lookup error
	lookups []provider.Message
}

func (s *lookingSender) Lookup(_ context.Context, m provider.Message) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups = append(s.lookups, m)
	if err := s.fail[m.ReminderID]; err != nil {
		return "", err
	}
	if id, ok := s.found[m.ReminderID]; ok {
		return id, nil
	}
	return "", provider.ErrNotFound
}

func TestUnknownOutcomesAreLookedUpBeforeAnyResend(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	ls := &lookingSender{scriptedSender: b.sender, found: map[int64]string{1: "SM-1", 4: "SM-4", 5: "SM-5"},
		fail: map[int64]error{3: http503}}
	b.w.sender = ls
	b.store.unknown = map[int64][]store.UnknownAttempt{}
	for id := int64(1); id <= 6; id++ {
		b.addRow(row(func(r *store.Delivery) { r.ID, r.State, r.Attempts = id, reminder.Retrying, 1 }))
		b.store.unknown[id] = []store.UnknownAttempt{{ReminderID: id, AttemptID: 100 + id, StartedAt: at(-time.Minute)}}
	}
	b.store.rows[4].Deadline = t0 // reached: found, so delivered rather than expired
	b.store.rows[5].Deadline = at(500 * time.Millisecond)
	b.w.cfg.DeadlineMargin = 100 * time.Millisecond // 5 may start: 500 ms before its deadline
	b.store.unknown[5] = nil                        // its first attempt; this one times out just before the deadline
	b.sender.errs[5] = provider.RetryableError("timeout", 0, context.DeadlineExceeded)
	b.store.rows[6].Deadline = t0 // reached, and not at the provider: expired
	b.store.rows[6].Attempts = 1
	// 7 times out just before its deadline, and the provider does not have
	// it yet: not expired on that, but left retrying at its deadline, to be
	// asked about again then.
	b.addRow(row(func(r *store.Delivery) { r.ID, r.State, r.Deadline = 7, reminder.Enqueued, at(500*time.Millisecond) }))
	b.sender.errs[7] = provider.RetryableError("timeout", 0, context.DeadlineExceeded)
	// 8 and 9 come back with their deadline within the margin: nothing may
	// be sent, but an earlier attempt's outcome is unknown, so the provider
	// is asked before either expires: 8 is there (delivered), 9 is not.
	for _, id := range []int64{8, 9} {
		b.addRow(row(func(r *store.Delivery) {
			r.ID, r.State, r.Attempts, r.Deadline = id, reminder.Retrying, 1, at(50*time.Millisecond)
		}))
		b.store.unknown[id] = []store.UnknownAttempt{{ReminderID: id, AttemptID: 100 + id, StartedAt: at(-time.Minute)}}
	}
	ls.found[8] = "SM-8"
	// 10's deadline is reached and the provider cannot be asked: it is not
	// expired on a guess but left to the reconciler (which asks again), and
	// its message is acked.
	b.addRow(row(func(r *store.Delivery) { r.ID, r.State, r.Attempts, r.Deadline = 10, reminder.Retrying, 1, t0 }))
	b.store.unknown[10] = []store.UnknownAttempt{{ReminderID: 10, AttemptID: 110, StartedAt: at(-time.Minute)}}
	ls.fail[10] = http503

	var ds []amqp.Delivery
	for id := int64(1); id <= 10; id++ {
		ds = append(ds, b.delivery(t, uint64(id), id))
	}
	b.w.process(context.Background(), ds)

	require.ElementsMatch(t, []int64{2, 5, 7}, b.sender.calls,
		"1 and 4 were found, 3 could not be checked, 6 expired: none of them sent again")
	for id, want := range map[int64]reminder.State{1: reminder.Delivered, 2: reminder.Delivered, 3: reminder.Retrying,
		4: reminder.Delivered, 5: reminder.Delivered, 6: reminder.Expired, 7: reminder.Retrying,
		8: reminder.Delivered, 9: reminder.Expired, 10: reminder.Retrying} {
		require.Equal(t, want, b.store.state(id), "reminder %d", id)
	}
	codes := map[int64]reminder.Code{}
	results := map[int64]reminder.Outcome{}
	ids := map[int64]string{}
	for _, o := range b.store.outcomes {
		codes[o.ReminderID], results[o.ReminderID], ids[o.ReminderID] = o.Code, o.Attempt, o.ProviderID
	}
	require.Equal(t, map[int64]reminder.Code{1: reminder.CodeFoundAtProvider, 2: reminder.CodeDelivered,
		3: reminder.CodeRetry, 5: reminder.CodeFoundAtProvider, 7: reminder.CodeRetry, 8: reminder.CodeFoundAtProvider,
		9: reminder.CodeDeadlineBeforeSend}, codes)
	require.Equal(t, reminder.OutcomeNotSent, results[3])
	require.Equal(t, reminder.OutcomeUnknown, results[7])
	require.Equal(t, map[int64]string{1: "SM-1", 2: "p-1", 3: "", 5: "SM-5", 7: "p-1", 8: "SM-8", 9: ""}, ids) // the scripted sender names an id even with its error
	for _, o := range b.store.outcomes {
		if o.ReminderID == 7 {
			require.False(t, o.NextAttemptAt.Before(b.store.rows[7].Deadline), "retrying at or after its deadline: never claimed again")
		}
	}

	byReminder := map[int64]provider.Message{}
	for _, m := range ls.lookups {
		byReminder[m.ReminderID] = m
	}
	require.Len(t, byReminder, 10)
	require.Equal(t, []provider.Earlier{{AttemptID: 101, Started: at(-time.Minute)}}, byReminder[1].Earlier)
	require.Len(t, byReminder[5].Earlier, 1, "the attempt that timed out")
	require.Equal(t, t0, byReminder[5].Earlier[0].Started)
	for _, tag := range []uint64{1, 2, 3, 4, 5, 6, 10} { // 7's retry message is published to its tier
		require.Equal(t, "ack", b.acks.settled[tag], "delivery %d", tag)
	}
}

// A sender that cannot look up (no Looker) sends as before.
func TestNoLookerSendsAsBefore(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	b.store.unknown = map[int64][]store.UnknownAttempt{1: {{ReminderID: 1, AttemptID: 9}}}
	b.addRow(row(func(r *store.Delivery) { r.ID, r.State, r.Attempts = 1, reminder.Retrying, 1 }))
	b.w.process(context.Background(), []amqp.Delivery{b.delivery(t, 1, 1)})
	require.Equal(t, []int64{1}, b.sender.calls)
	require.Equal(t, reminder.Delivered, b.store.state(1))
}
