package e2e_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Provider failover through four real sms-worker processes: Twilio (fake A)
// first, the generic API (fake B) second. A starts answering 503 mid-run and
// the fleet moves to B within a few failures; once A recovers, the fleet's
// probe finds it and A takes the traffic again. No reminder is accepted by
// both providers.
func TestProviderFailoverAcrossTheFleet(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	a, b, env := f.twoProviders(t, "NUDGE_SMS_FAILOVER_AFTER=3", "NUDGE_SMS_FAILOVER_PROBE=1s")
	var workers []*testenv.Proc
	for range 4 {
		workers = append(workers, f.start(t, "sms-worker", env, "--backoff-base", "250ms", "--backoff-max", "1s"))
	}
	batch := func(name string, n int) []int64 {
		ids := f.scheduleSMS(t, name, n)
		f.runOK(t, "dispatcher")
		return ids
	}

	// 1. All is well: A takes everything.
	first := batch("first", 8)
	f.waitAll(t, first, reminder.Delivered)
	require.Len(t, a.Messages(), 8)
	require.Empty(t, b.Messages())

	// 2. A answers 503 to every send: the fleet moves to B.
	require.NoError(t, a.SetConfig(fakesms.Config{Rate5xx: 1}))
	faulted := time.Now()
	second := batch("second", 12)
	f.waitAll(t, second, reminder.Delivered)
	require.Len(t, a.Messages(), 8, "A accepted nothing while it failed")
	require.Len(t, b.Messages(), 12)
	moved := b.Messages()[0].AcceptedAt.Sub(faulted)
	require.Less(t, moved, 10*time.Second, "the fleet moved to B within the window")
	t.Logf("first acceptance at B %s after A began failing", moved)
	require.Equal(t, "generic", f.failoverCurrent(t))

	// 3. A recovers: a probe (one send to A, at most every second, by one
	// worker of the fleet) finds it while traffic flows and brings the fleet
	// back; each worker follows within its cache time (a second), so soon a
	// whole batch goes to A.
	require.NoError(t, a.SetConfig(fakesms.Config{}))
	total := 8 + 12
	for i := 0; ; i++ {
		require.Less(t, i, 20, "A did not take the traffic again")
		before := len(a.Messages())
		more := batch(fmt.Sprintf("third%d", i), 4)
		f.waitAll(t, more, reminder.Delivered)
		total += len(more)
		if len(a.Messages()) == before+len(more) && f.failoverCurrent(t) == "twilio" {
			t.Logf("a whole batch at A again after %d batches", i+1)
			break
		}
	}
	for _, w := range workers {
		stop(t, w)
	}

	// Once per logical reminder: no recipient reached through both.
	seen := map[string]string{}
	for _, m := range a.Messages() {
		require.Empty(t, seen[m.To], "%s accepted twice", m.To)
		seen[m.To] = "A"
	}
	for _, m := range b.Messages() {
		require.Empty(t, seen[m.To], "%s accepted by B after %s", m.To, seen[m.To])
		seen[m.To] = "B"
	}
	require.Len(t, seen, total)
}

// recipients numbers the reminders of scheduleSMS.
var recipients atomic.Int64

// scheduleSMS records n SMS reminders due now, with keys and numbers of
// their own (name tells batches apart).
func (f *procFleet) scheduleSMS(t *testing.T, name string, n int) []int64 {
	t.Helper()
	now := time.Now()
	reqs := make([]intake.Request, n)
	for i := range reqs {
		reqs[i] = intake.Request{Tenant: "acme", Key: fmt.Sprintf("%s-%d", name, i), Channel: reminder.SMS,
			Template: "course-expiry", Recipient: fmt.Sprintf("+1%010d", recipients.Add(1)),
			DueAt: now.Add(-time.Second), Deadline: now.Add(time.Hour)}
	}
	return f.scheduleAll(t, reqs)
}

// failoverCurrent is the SMS channel's provider in use, as the fleet shares it.
func (f *procFleet) failoverCurrent(t *testing.T) string {
	t.Helper()
	var cur string
	require.NoError(t, f.db.Pool.QueryRow(context.Background(), `SELECT current FROM provider_failover WHERE channel = 'sms'`).Scan(&cur))
	return cur
}

// An attempt whose outcome is unknown is looked up at the provider it went
// to, and only there, wherever the fleet has moved since (issue 16: "it
// never goes to the second before the first has been checked"). One
// sms-worker process, Twilio (fake A) first and the generic API (fake B)
// second, a failover after one retryable failure:
//
//  1. A accepts and holds the answer past the send timeout: the outcome is
//     unknown, and the failure moves the fleet to B. The retry looks the
//     message up at A (A counts the lookup), finds it, and records the
//     reminder delivered: nothing is sent to B, and B is not even asked.
//  2. Now on B, B does the same: the fleet moves back to A, and the retry
//     looks up at B only; A is not asked, and receives nothing.
func TestUnknownOutcomeIsLookedUpAtItsProvider(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	a, b, env := f.twoProviders(t, "NUDGE_SMS_FAILOVER_AFTER=1", "NUDGE_SMS_FAILOVER_PROBE=1h")
	w := f.start(t, "sms-worker", env, "--send-timeout", "1s", "--backoff-base", "250ms", "--backoff-max", "1s")

	// 1. Unknown at A; the fleet moves to B.
	require.NoError(t, a.SetConfig(fakesms.Config{Script: []fakesms.Outcome{fakesms.TimeoutAfterAccept}}))
	first := f.scheduleSMS(t, "at-a", 1)
	f.runOK(t, "dispatcher")
	f.waitAll(t, first, reminder.Delivered)
	require.Equal(t, "generic", f.failoverCurrent(t), "the timeout at A moved the fleet to B")
	require.Equal(t, []string{"twilio", "generic"}, f.attemptProviders(t, first[0]),
		"each attempt records its provider: the second was claimed after the move")
	require.Len(t, a.Messages(), 1, "A holds the first attempt's message")
	require.GreaterOrEqual(t, a.Stats().Lookups, 1, "the unknown outcome was looked up at A")
	require.Empty(t, b.Messages(), "nothing was sent to B")
	require.Zero(t, b.Stats().Lookups, "B, where the attempt did not go, was not asked")
	require.Equal(t, 1, a.Stats().Attempts, "no second create at A either")
	require.Contains(t, f.reasons(t, first[0]), "found at the provider")
	lookupsAtA := a.Stats().Lookups

	// 2. Unknown at B; the fleet moves back to A.
	require.NoError(t, b.SetConfig(fakesms.Config{Script: []fakesms.Outcome{fakesms.TimeoutAfterAccept}}))
	second := f.scheduleSMS(t, "at-b", 1)
	f.runOK(t, "dispatcher")
	f.waitAll(t, second, reminder.Delivered)
	stop(t, w)
	require.Equal(t, "twilio", f.failoverCurrent(t), "the timeout at B moved the fleet on, to A")
	require.Equal(t, []string{"generic", "twilio"}, f.attemptProviders(t, second[0]))
	require.Len(t, b.Messages(), 1, "B holds the message")
	require.GreaterOrEqual(t, b.Stats().Lookups, 1, "looked up at B")
	require.Equal(t, lookupsAtA, a.Stats().Lookups, "A, where the attempt did not go, was not asked")
	require.Len(t, a.Messages(), 1, "nothing more was sent to A")
}

// attemptProviders lists the provider each attempt of a reminder went to.
func (f *procFleet) attemptProviders(t *testing.T, id int64) []string {
	t.Helper()
	rows, err := f.db.Pool.Query(context.Background(),
		`SELECT coalesce(provider, '') FROM delivery_attempts WHERE reminder_id = $1 ORDER BY id`, id)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// twoProviders is the fleet's fake-sms as Twilio (a) and a second fake as
// the generic API (b), with the environment of an sms-worker that fails
// over from a to b (extra adds failover settings).
func (f *procFleet) twoProviders(t *testing.T, extra ...string) (a, b *fakesms.Server, env []string) {
	t.Helper()
	b = fakesms.New()
	hs := httptest.NewServer(b)
	t.Cleanup(hs.Close)
	t.Cleanup(b.Close)
	return f.sms, b, f.twilioEnv(append([]string{"NUDGE_SMS_PROVIDERS=twilio,generic", "NUDGE_SMS_URL=" + hs.URL}, extra...)...)
}
