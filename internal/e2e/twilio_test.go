package e2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// The Twilio adapter in real sms-worker processes, against fake-sms speaking
// Twilio's API: Twilio does not deduplicate, so these count creates.

func (f *procFleet) twilioEnv(extra ...string) []string {
	return f.env(append([]string{
		"NUDGE_SMS_API=twilio", "NUDGE_TWILIO_URL=" + f.smsURL,
		"NUDGE_TWILIO_ACCOUNT_SID=AC00000000000000000000000000000e2e", "NUDGE_TWILIO_AUTH_TOKEN=e2e-token",
		"NUDGE_TWILIO_FROM=+15005550006",
	}, extra...)...)
}

// Inventory: the provider accepted, and the worker is killed while it waits
// for the answer (a timeout after accept, cut short by SIGKILL). The next
// worker asks Twilio before sending again, finds the message and records
// the reminder delivered: one text reached the phone.
func TestTwilioWorkerKilledWhileTheProviderHoldsTheAnswer(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	// Accept, then hold the answer until the client goes away.
	require.NoError(t, f.sms.SetConfig(fakesms.Config{Script: []fakesms.Outcome{fakesms.TimeoutAfterAccept}}))
	ids := f.schedule(t, reminder.SMS, 1)
	f.runOK(t, "dispatcher")

	w := f.start(t, "sms-worker", f.twilioEnv(), "--send-lease", "2s", "--send-timeout", "1m")
	require.Eventually(t, func() bool { return len(f.sms.Messages()) == 1 }, 30*time.Second, 20*time.Millisecond,
		"the provider accepts the first attempt")
	require.NoError(t, w.Signal(syscall.SIGKILL))
	_, sig := w.Wait(t, 10*time.Second)
	require.Equal(t, syscall.SIGKILL, sig)
	require.Equal(t, reminder.Sending, f.get(t, ids[0]).State, "killed inside the window: nothing recorded")

	f.start(t, "reconciler", f.env(), "--every", "300ms")
	w2 := f.start(t, "sms-worker", f.twilioEnv())
	f.waitAll(t, ids, reminder.Delivered)
	stop(t, w2)

	st := f.sms.Stats()
	require.Equal(t, 1, st.Attempts, "one create reached Twilio: the second attempt looked it up instead")
	require.Equal(t, 1, st.Accepted, "one message reached the phone")
	require.GreaterOrEqual(t, st.Lookups, 1)
	require.Equal(t, []string{"", "delivered"}, f.attemptOutcomes(t, ids[0]), "the killed attempt stays unknown")
	require.Contains(t, f.reasons(t, ids[0]), "found at the provider")
}

// 429 with Retry-After and 503 are retried, 21211 (an invalid number) fails
// the reminder at once, through real processes.
func TestTwilioRetryableAndPermanentAnswers(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	require.NoError(t, f.sms.SetConfig(fakesms.Config{RetryAfterSeconds: 1, Script: []fakesms.Outcome{"429", "503", "400"}}))
	ids := f.schedule(t, reminder.SMS, 3)
	f.runOK(t, "dispatcher")
	w := f.start(t, "sms-worker", f.twilioEnv(), "--batch", "1", "--concurrency", "1")
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if !f.get(t, id).State.Terminal() {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond)
	stop(t, w)

	var failed []string
	delivered := 0
	for _, id := range ids {
		switch r := f.get(t, id); r.State {
		case reminder.Failed:
			failed = append(failed, r.Reason)
		case reminder.Delivered:
			delivered++
		}
	}
	require.Equal(t, 2, delivered)
	require.Len(t, failed, 1)
	require.True(t, strings.Contains(failed[0], "twilio_21211"), "reason %q", failed[0])
	st := f.sms.Stats()
	require.Equal(t, 2, st.Accepted)
	require.Equal(t, 5, st.Attempts, "three first attempts and two retries")
	require.Equal(t, map[int]int{429: 1, 503: 1, 400: 1, 201: 2}, st.ByStatus)
}

// Twilio status callbacks through a real sms-worker (--twilio-callback-listen):
// the fake Twilio reports each message's delivery by a signed callback; the
// worker verifies it and records it by SID, beside the attempt: one
// delivered, one undelivered with the carrier's 30003. Both reminders stay
// delivered (a carrier's later refusal never moves a reminder back), and a
// callback with a forged signature is refused with 403.
func TestTwilioStatusCallbacksRecordedBesideTheAttempt(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	const account, token = "AC00000000000000000000000000000e2e", "e2e-token"
	fake := fakesms.New(fakesms.WithTwilioAccount(account, token))
	hs := httptest.NewServer(fake)
	t.Cleanup(hs.Close)
	t.Cleanup(fake.Close)
	require.NoError(t, fake.SetConfig(fakesms.Config{Script: []fakesms.Outcome{fakesms.Accept, fakesms.AcceptUndelivered}}))
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	callback := "http://" + addr + "/twilio/status"

	ids := f.schedule(t, reminder.SMS, 2)
	f.runOK(t, "dispatcher")
	w := f.start(t, "sms-worker", f.twilioEnv("NUDGE_TWILIO_URL="+hs.URL), "--batch", "1", "--concurrency", "1",
		"--twilio-status-callback", callback, "--twilio-callback-listen", addr)
	f.waitAll(t, ids, reminder.Delivered)

	statuses := func() map[string]string {
		rows, err := f.db.Pool.Query(context.Background(), `
			SELECT s.status || coalesce(':' || s.error_code, '')
			  FROM delivery_attempts a JOIN sms_message_status s ON s.message_sid = a.provider_message_id
			 WHERE a.reminder_id = ANY($1)`, ids)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		out := map[string]string{}
		for _, s := range got {
			out[s] = s
		}
		return out
	}
	require.Eventually(t, func() bool {
		s := statuses()
		return s["delivered"] != "" && s["undelivered:30003"] != ""
	}, 20*time.Second, 50*time.Millisecond, "the callbacks were recorded beside the attempts")
	for _, id := range ids {
		require.Equal(t, reminder.Delivered, f.get(t, id).State, "a carrier's refusal does not move the reminder")
	}

	form := url.Values{"MessageSid": {fake.Messages()[0].ID}, "MessageStatus": {"failed"}, "ErrorCode": {"30007"}}
	req, err := http.NewRequest(http.MethodPost, callback, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Twilio-Signature", "forged")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.NotContains(t, statuses(), "failed:30007")
	stop(t, w)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Inventory, at the deadline: Twilio accepted, the worker is killed while
// it waits for the answer, and the deadline passes before any worker sees
// the reminder again. The reconciler (a real process, --once) does not
// expire it on a guess: it asks Twilio about the attempt (its provider is
// recorded), finds the message, and records the reminder delivered, settled
// by lookup. Nothing is sent again.
func TestTwilioDeadlinePassesAfterAKillAndTheReconcilerSettlesByLookup(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	require.NoError(t, f.sms.SetConfig(fakesms.Config{Script: []fakesms.Outcome{fakesms.TimeoutAfterAccept}}))
	now := time.Now()
	ids := f.scheduleAll(t, []intake.Request{{Tenant: "acme", Key: "killed-at-deadline", Channel: reminder.SMS,
		Template: "course-expiry", Recipient: "+14155550199", DueAt: now.Add(-time.Second), Deadline: now.Add(8 * time.Second)}})
	f.runOK(t, "dispatcher")

	w := f.start(t, "sms-worker", f.twilioEnv(), "--send-lease", "2s", "--send-timeout", "1m")
	require.Eventually(t, func() bool { return len(f.sms.Messages()) == 1 }, 30*time.Second, 20*time.Millisecond)
	require.NoError(t, w.Signal(syscall.SIGKILL))
	w.Wait(t, 10*time.Second)
	require.Equal(t, reminder.Sending, f.get(t, ids[0]).State)

	time.Sleep(time.Until(now.Add(9 * time.Second))) // past the deadline and the send lease
	p := f.start(t, "reconciler", f.twilioEnv(), "--once")
	code, _ := p.Wait(t, 60*time.Second)
	require.Zero(t, code, p.Output())

	r := f.get(t, ids[0])
	require.Equal(t, reminder.Delivered, r.State, f.reasons(t, ids[0]))
	require.Contains(t, r.Reason, "settled by lookup")
	evs, err := intake.Events(context.Background(), f.db.Pool, ids[0])
	require.NoError(t, err)
	require.Equal(t, reminder.CodeSettledByLookup, evs[len(evs)-1].Code)
	st := f.sms.Stats()
	require.Equal(t, 1, st.Attempts, "one create: nothing sent again")
	require.GreaterOrEqual(t, st.Lookups, 1)
	require.Equal(t, []string{"twilio"}, f.attemptProviders(t, ids[0]))
}
