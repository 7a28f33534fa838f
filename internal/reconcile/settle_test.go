package reconcile_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// settleBundle is the reconciler with SMS lookups over two fake providers,
// Twilio (a) and the generic API (b), over real HTTP, failing over in that
// order as sms-worker --sms-providers twilio,generic would.
type settleBundle struct {
	*bundle
	a, b       *fakesms.Server
	closeB     func()
	twilio     *sms.TwilioClient
	generic    *sms.Client
	lookupHold time.Duration
}

func settleSetup(t *testing.T) *settleBundle {
	t.Helper()
	sb := &settleBundle{bundle: setup(t), lookupHold: time.Hour}
	serve := func() (*fakesms.Server, string, func()) {
		f := fakesms.New(fakesms.WithClock(sb.clock))
		hs := httptest.NewServer(f)
		t.Cleanup(hs.Close)
		t.Cleanup(f.Close)
		return f, hs.URL, hs.Close
	}
	var aURL, bURL string
	sb.a, aURL, _ = serve()
	sb.b, bURL, sb.closeB = serve()
	var err error
	sb.twilio, err = sms.NewTwilio(sms.TwilioConfig{URL: aURL, AccountSID: "AC0123", AuthToken: "token", From: "+15005550006",
		Timeout: time.Second})
	require.NoError(t, err)
	sb.generic, err = sms.New(sms.Config{URL: bURL, Timeout: time.Second})
	require.NoError(t, err)
	looker, err := sms.NewFailover(sms.FailoverConfig{}, []sms.Named{{Name: sms.APITwilio, Looker: sb.twilio},
		{Name: sms.APIGeneric, Looker: sb.generic}})
	require.NoError(t, err)
	sb.rec.Lookup = reconcile.Lookup{Lookers: map[reminder.Channel]provider.Looker{reminder.SMS: looker}, Hold: sb.lookupHold}
	return sb
}

// attempt schedules an SMS reminder due now with a deadline a minute away,
// dispatches it and claims an attempt recorded at provider via, as a worker
// would, and returns it with its row.
func (sb *settleBundle) attempt(t *testing.T, key, via string) (store.Delivery, store.Attempt) {
	t.Helper()
	ctx := context.Background()
	id := sb.schedule(t, key, time.Minute)
	now := sb.clock.Now()
	claimed, err := sb.st.ClaimDue(ctx, now, now, 10, time.Minute, "d")
	require.NoError(t, err)
	var fs []store.Fenced
	for _, c := range claimed {
		if c.ID == id {
			fs = append(fs, store.Fenced{ID: c.ID, Fence: c.Fence})
		}
	}
	require.Len(t, fs, 1)
	rows, atts, err := sb.st.ClaimForDelivery(ctx, now, reminder.SMS, via, fs, 30*time.Second, "sms-worker-1")
	require.NoError(t, err)
	require.Contains(t, atts, id)
	return rows[id], atts[id]
}

// send sends the reminder's message through the adapter, as the attempt's
// request that left before its worker died.
func send(t *testing.T, s provider.Sender, row store.Delivery) {
	t.Helper()
	_, err := s.Send(context.Background(), provider.Message{ReminderID: row.ID, IdempotencyKey: row.IdempotencyKey,
		Tenant: row.Tenant, Recipient: row.Recipient, Template: row.Template, Deadline: row.Deadline})
	require.NoError(t, err)
}

// lastEvent is the code and reason of the reminder's last event.
func (sb *settleBundle) lastEvent(t *testing.T, id int64) (reminder.Code, string) {
	t.Helper()
	evs, err := intake.Events(context.Background(), sb.db.Pool, id)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	return evs[len(evs)-1].Code, evs[len(evs)-1].Reason
}

// At the deadline, reminders whose attempt's outcome is unknown are settled
// at that attempt's provider: the one Twilio holds (its worker died after
// the request left) and the one the generic API holds (its answer timed
// out, and the deadline came before the retry) end delivered, "settled by
// lookup"; the one whose worker died before its request left ends expired.
// Each is asked about at its own provider only, and nothing is sent.
func TestUnknownOutcomesAreSettledByLookupAtTheDeadline(t *testing.T) {
	t.Parallel()
	sb := settleSetup(t)
	ctx := context.Background()

	heldAtTwilio, _ := sb.attempt(t, "held-at-twilio", sms.APITwilio)
	send(t, sb.twilio, heldAtTwilio) // the worker dies before recording: sending, outcome unknown
	neverLeft, _ := sb.attempt(t, "never-left", sms.APITwilio)
	heldAtGeneric, att := sb.attempt(t, "held-at-generic", sms.APIGeneric)
	send(t, sb.generic, heldAtGeneric)
	next := sb.clock.Now().Add(30 * time.Second)
	moved, err := sb.st.RecordOutcomes(ctx, sb.clock.Now(), []store.Outcome{{ReminderID: heldAtGeneric.ID, Fence: att.Fence,
		AttemptID: att.AttemptID, Code: reminder.CodeRetry, Attempt: reminder.OutcomeUnknown, NextAttemptAt: &next,
		Error: "timeout", Reason: "retry after a timeout"}}, "sms-worker-1")
	require.NoError(t, err)
	require.True(t, moved[heldAtGeneric.ID])
	// An email reminder past its deadline is no lookup's business: it
	// expires in the same pass.
	mail, err := intake.Schedule(ctx, sb.db.Pool, intake.Request{Tenant: "acme", Key: "mail", Channel: reminder.Email,
		Recipient: "a@example.com", Template: "course-expiry", DueAt: sb.clock.Now(), Deadline: sb.clock.Now().Add(time.Minute)})
	require.NoError(t, err)
	sentA, sentB := sb.a.Stats().Attempts, sb.b.Stats().Attempts

	sb.clock.Advance(2 * time.Minute) // past every deadline and send lease
	sum, err := sb.rec.Pass(ctx)
	require.NoError(t, err)

	for _, id := range []int64{heldAtTwilio.ID, heldAtGeneric.ID} {
		require.Equal(t, reminder.Delivered, sb.get(t, id).State, "reminder %d: the provider holds its message", id)
		code, reason := sb.lastEvent(t, id)
		require.Equal(t, reminder.CodeSettledByLookup, code)
		require.Contains(t, reason, "settled by lookup")
	}
	require.Equal(t, reminder.Expired, sb.get(t, neverLeft.ID).State, "the provider has nothing of it")
	require.Equal(t, reminder.Expired, sb.get(t, mail.ID).State)
	require.Equal(t, 2, sum.SettledByLookup)
	require.Equal(t, 1, sum.LookedUpNotFound)
	require.Zero(t, sum.LookupsHeld)
	require.Equal(t, 2, sum.ExpiredBy[reminder.SMS]+sum.ExpiredBy[reminder.Email])
	require.Equal(t, 2, sb.a.Stats().Lookups, "Twilio was asked about its two")
	require.Equal(t, 1, sb.b.Stats().Lookups, "the generic API about its one")
	require.Equal(t, sentA, sb.a.Stats().Attempts, "nothing sent")
	require.Equal(t, sentB, sb.b.Stats().Attempts, "nothing sent")

	sum, err = sb.rec.Pass(ctx)
	require.NoError(t, err)
	require.Zero(t, sum.SettledByLookup+sum.LookedUpNotFound+sum.LookupsHeld+sum.Expired, "a second pass has nothing left")
}

// A provider that cannot answer leaves its reminder as it is (never sent,
// never expired on a guess), asked again every pass, until the hold runs
// out: then it expires, its reason saying the outcome is unknown.
func TestUnknownOutcomeWaitsForItsProviderForABoundedTime(t *testing.T) {
	t.Parallel()
	sb := settleSetup(t)
	ctx := context.Background()
	row, _ := sb.attempt(t, "provider-down", sms.APIGeneric)
	send(t, sb.generic, row)
	sb.closeB()

	sb.clock.Advance(2 * time.Minute)
	for range 2 {
		sum, err := sb.rec.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, sum.LookupsHeld)
		require.Zero(t, sum.Expired)
		require.Equal(t, reminder.Sending, sb.get(t, row.ID).State, "held: its provider could not be asked")
		sb.clock.Advance(sb.lookupHold / 2)
	}
	require.Zero(t, sb.a.Stats().Lookups, "Twilio, where the attempt did not go, is never asked")

	sum, err := sb.rec.Pass(ctx) // the deadline is now more than the hold ago
	require.NoError(t, err)
	require.Equal(t, 1, sum.Expired)
	require.Zero(t, sum.LookupsHeld)
	r := sb.get(t, row.ID)
	require.Equal(t, reminder.Expired, r.State)
	require.Contains(t, r.Reason, "outcome unknown")
	require.Equal(t, 1, sb.b.Stats().Attempts, "sent once, before the outage; never again")
}

func TestLookupDecisions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"found", nil, "delivered"},
		{"not found", provider.ErrNotFound, "expire"},
		{"found failed for good (30003)", provider.PermanentError("twilio_30003", errors.New("undelivered")), "expire"},
		{"503", provider.RetryableError("http_503", 0, errors.New("unavailable")), "hold"},
		{"timeout", provider.RetryableError("timeout", 0, context.DeadlineExceeded), "hold"},
		{"anything else", errors.New("connection refused"), "hold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, reconcile.OnLookup(tc.err))
		})
	}
}
