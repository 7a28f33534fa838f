package fakesms_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fakesms"
)

const (
	acct  = "AC0123456789abcdef0123456789abcdef"
	token = "tok"
)

func (b *bundle) twilio(t *testing.T, method, path string, form url.Values, auth bool) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, b.url+"/2010-04-01/Accounts/"+acct+path,
		strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if auth {
		req.SetBasicAuth(acct, token)
	}
	resp, err := b.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var r response
	r.status, r.header = resp.StatusCode, resp.Header
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r.body))
	return r
}

func TestTwilioCreateValidatesAndDoesNotDeduplicate(t *testing.T) {
	t.Parallel()
	b := setup(t, fakesms.WithTwilioAccount(acct, token))
	ok := url.Values{"To": {"+15555550100"}, "From": {"+15005550006"}, "Body": {"hi"}}

	r := b.twilio(t, http.MethodPost, "/Messages.json", ok, false)
	require.Equal(t, http.StatusUnauthorized, r.status)
	require.EqualValues(t, 20003, r.body["code"])

	for _, tt := range []struct {
		drop, set string
		code      int
	}{{"To", "", 21604}, {"", "To=12", 21211}, {"From", "", 21603}, {"Body", "", 21602}} {
		form := url.Values{}
		for k, v := range ok {
			form[k] = v
		}
		form.Del(tt.drop)
		if k, v, found := strings.Cut(tt.set, "="); found {
			form.Set(k, v)
		}
		r := b.twilio(t, http.MethodPost, "/Messages.json", form, true)
		require.Equal(t, http.StatusBadRequest, r.status, "%+v", tt)
		require.EqualValues(t, tt.code, r.body["code"], "%+v", tt)
	}

	first := b.twilio(t, http.MethodPost, "/Messages.json", ok, true)
	second := b.twilio(t, http.MethodPost, "/Messages.json", ok, true)
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "queued", first.body["status"])
	require.NotEqual(t, first.body["sid"], second.body["sid"])
	require.Len(t, b.fake.Messages(), 2, "Twilio does not deduplicate")

	got := b.twilio(t, http.MethodGet, "/Messages/"+first.body["sid"].(string)+".json", nil, true)
	require.Equal(t, http.StatusOK, got.status)
	require.Equal(t, "sent", got.body["status"])
	missing := b.twilio(t, http.MethodGet, "/Messages/SMnope.json", nil, true)
	require.Equal(t, http.StatusNotFound, missing.status)
	require.EqualValues(t, 20404, missing.body["code"])
}

func TestTwilioInjectedFaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.fake.SetConfig(fakesms.Config{RetryAfterSeconds: 4, Script: []fakesms.Outcome{"429", "503", "400"}}))
	form := url.Values{"To": {"+15555550100"}, "From": {"+15005550006"}, "Body": {"hi"}}
	for _, want := range []struct{ status, code int }{{429, 20429}, {503, 20503}, {400, 21211}} {
		r := b.twilio(t, http.MethodPost, "/Messages.json", form, false)
		require.Equal(t, want.status, r.status)
		require.EqualValues(t, want.code, r.body["code"])
		if want.status == 429 {
			require.Equal(t, "4", r.header.Get("Retry-After"))
		}
	}
	require.Empty(t, b.fake.Messages())
}

func TestTwilioListFiltersAndPages(t *testing.T) {
	t.Parallel()
	fc := clock.NewFake(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
	b := setup(t, fakesms.WithClock(fc))
	send := func(to, from string) {
		r := b.twilio(t, http.MethodPost, "/Messages.json", url.Values{"To": {to}, "From": {from}, "Body": {"x"}}, false)
		require.Equal(t, http.StatusCreated, r.status)
	}
	send("+15555550100", "+15005550006")
	fc.Advance(24 * time.Hour)
	for range 3 {
		send("+15555550100", "+15005550006")
	}
	send("+15555550101", "+15005550006")
	send("+15555550100", "+15005550007")

	list := func(q string) response {
		return b.twilio(t, http.MethodGet, "/Messages.json?"+q, nil, false)
	}
	r := list("To=%2B15555550100&From=%2B15005550006&PageSize=2")
	require.Len(t, r.body["messages"], 2)
	require.NotNil(t, r.body["next_page_uri"])
	newest := r.body["messages"].([]any)[0].(map[string]any)
	require.Contains(t, newest["date_created"], "02 Jan 2030")

	next, err := url.Parse(r.body["next_page_uri"].(string))
	require.NoError(t, err)
	r = list(next.RawQuery)
	require.Len(t, r.body["messages"], 2)
	require.Nil(t, r.body["next_page_uri"])

	r = list("To=%2B15555550100&From=%2B15005550006&DateSent%3E=2030-01-02")
	require.Len(t, r.body["messages"], 3, "DateSent>= is on or after that day")
	r = list("To=%2B15555550100&DateSent=2030-01-01")
	require.Len(t, r.body["messages"], 1)
	require.Equal(t, 4, b.fake.Stats().Lookups)
}

func TestTwilioStatusCallbacks(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []url.Values
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, r.ParseForm())
		mu.Lock()
		got = append(got, r.PostForm)
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	b := setup(t)
	require.NoError(t, b.fake.Enqueue(fakesms.Accept, fakesms.AcceptUndelivered))
	for range 2 {
		r := b.twilio(t, http.MethodPost, "/Messages.json", url.Values{"To": {"+15555550100"}, "From": {"+15005550006"},
			"Body": {"x"}, "StatusCallback": {hook.URL + "/cb?nudge_ref=1"}}, false)
		require.Equal(t, http.StatusCreated, r.status)
	}
	b.fake.Close() // waits for the callbacks
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 4)
	var final []string
	for _, f := range got {
		if s := f.Get("MessageStatus"); s != "sent" {
			final = append(final, s+f.Get("ErrorCode"))
		}
	}
	require.ElementsMatch(t, []string{"delivered", "undelivered30003"}, final)
}
