package sms_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
)

// Twilio's own example (its webhook security docs): this URL, these
// parameters and auth token 12345 sign as 0/KCTR6DLpKmkAf8muzZqo1nDgQ=.
func TestTwilioSignatureMatchesTwiliosExample(t *testing.T) {
	t.Parallel()
	form := url.Values{"CallSid": {"CA1234567890ABCDE"}, "Caller": {"+12349013030"}, "Digits": {"1234"},
		"From": {"+12349013030"}, "To": {"+18005551212"}}
	require.Equal(t, "0/KCTR6DLpKmkAf8muzZqo1nDgQ=", sms.TwilioSignature("12345", "https://mycompany.com/myapp.php?foo=1&bar=2", form))
}

func TestStatusRank(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status string
		want   int
	}{{"queued", 1}, {"sending", 2}, {"sent", 3}, {"delivered", 4}, {"undelivered", 4}, {"failed", 4}, {"read", 5},
		{"received", 0}, {"", 0}, {"DELIVERED", 0}} {
		require.Equal(t, tc.want, sms.StatusRank(tc.status), tc.status)
	}
}

// Status callbacks from the fake Twilio, over real HTTP, into PostgreSQL:
// a delivered message and an undelivered one (30003) are recorded by SID;
// a forged signature gets 403 and changes nothing; a late "sent" does not
// move "delivered" back; a malformed or oversized body is refused.
func TestStatusCallbacksAreVerifiedAndRecorded(t *testing.T) {
	t.Parallel()
	const account, token = "AC00000000000000000000000000000cb1", "cb-token"
	db := testenv.Postgres(t)
	st := store.New(db.Pool)
	ctx := context.Background()
	fake := fakesms.New(fakesms.WithTwilioAccount(account, token))
	fs := httptest.NewServer(fake)
	t.Cleanup(fs.Close)
	t.Cleanup(fake.Close)

	hs := httptest.NewServer(nil)
	t.Cleanup(hs.Close)
	callbackURL := hs.URL + "/twilio/status"
	cb, err := sms.NewCallbacks(token, callbackURL, st, clock.Real{}, zerolog.Nop())
	require.NoError(t, err)
	hs.Config.Handler = cb

	c, err := sms.NewTwilio(sms.TwilioConfig{URL: fs.URL, AccountSID: account, AuthToken: token, From: "+15005550006",
		StatusCallback: callbackURL, Timeout: 5 * time.Second})
	require.NoError(t, err)
	delivered, err := c.Send(ctx, message("cb-delivered"))
	require.NoError(t, err)
	require.NoError(t, fake.Enqueue(fakesms.AcceptUndelivered))
	undelivered, err := c.Send(ctx, message("cb-undelivered"))
	require.NoError(t, err)

	type row struct {
		status string
		code   *int
	}
	read := func(sid string) row {
		var r row
		err := db.Pool.QueryRow(ctx, `SELECT status, error_code FROM sms_message_status WHERE message_sid = $1`, sid).Scan(&r.status, &r.code)
		if err == pgx.ErrNoRows {
			return row{}
		}
		require.NoError(t, err)
		return r
	}
	require.Eventually(t, func() bool {
		return read(delivered).status == "delivered" && read(undelivered).status == "undelivered"
	}, 10*time.Second, 20*time.Millisecond, "the fake's signed callbacks were recorded")
	require.Nil(t, read(delivered).code)
	require.Equal(t, 30003, *read(undelivered).code, "the carrier's error code")

	post := func(path string, form url.Values, sig string) int {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if sig != "" {
			req.Header.Set(sms.TwilioSignatureHeader, sig)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	signed := func(path string, form url.Values) string {
		return sms.TwilioSignature(token, hs.URL+path, form)
	}
	failed := url.Values{"MessageSid": {delivered}, "MessageStatus": {"failed"}, "ErrorCode": {"30007"}, "AccountSid": {account}}
	require.Equal(t, http.StatusForbidden, post("/twilio/status", failed, ""), "no signature")
	require.Equal(t, http.StatusForbidden, post("/twilio/status", failed, sms.TwilioSignature("guessed", hs.URL+"/twilio/status", failed)),
		"signed with another token")
	require.Equal(t, http.StatusForbidden, post("/twilio/status?nudge_ref=0", failed, signed("/twilio/status", failed)),
		"signed for another URL")
	tampered := url.Values{"MessageSid": {delivered}, "MessageStatus": {"failed"}, "ErrorCode": {"30008"}, "AccountSid": {account}}
	require.Equal(t, http.StatusForbidden, post("/twilio/status", tampered, signed("/twilio/status", failed)), "a changed parameter")
	require.Equal(t, "delivered", read(delivered).status, "nothing forged was recorded")

	late := url.Values{"MessageSid": {delivered}, "MessageStatus": {"sent"}}
	require.Equal(t, http.StatusNoContent, post("/twilio/status?nudge_ref=1", late, signed("/twilio/status?nudge_ref=1", late)))
	require.Equal(t, "delivered", read(delivered).status, "a late 'sent' does not move 'delivered' back")

	bad := url.Values{"MessageSid": {"SM-not-a-sid"}, "MessageStatus": {"delivered"}}
	require.Equal(t, http.StatusBadRequest, post("/twilio/status", bad, signed("/twilio/status", bad)))
	huge := url.Values{"MessageSid": {delivered}, "MessageStatus": {"read"}, "Body": {strings.Repeat("x", 20<<10)}}
	require.Equal(t, http.StatusRequestEntityTooLarge, post("/twilio/status", huge, signed("/twilio/status", huge)))
	resp, err := http.Get(hs.URL + "/twilio/status")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}
