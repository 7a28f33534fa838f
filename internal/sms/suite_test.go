package sms_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
)

// One behavioural suite that every SMS adapter passes against the fake
// provider, over real HTTP: what the worker relies on (classification,
// Retry-After, and above all that an unknown outcome is found by Lookup
// instead of sent twice) is the same whichever API the provider speaks.

const (
	testAccount = "AC00000000000000000000000000000001"
	testToken   = "twilio-auth-token"
)

// adapter builds one implementation against a fake.
type adapter struct {
	name string
	// new returns the adapter with the given request timeout.
	new func(t *testing.T, b *bundle, timeout time.Duration) provider.Looker
	// permanentCode is the code of an injected 400.
	permanentCode string
}

func adapters() []adapter {
	return []adapter{
		{name: "generic", permanentCode: "http_400",
			new: func(t *testing.T, b *bundle, timeout time.Duration) provider.Looker { return b.client(t, timeout) }},
		{name: "generic over net/http", permanentCode: "http_400",
			new: func(t *testing.T, b *bundle, timeout time.Duration) provider.Looker {
				b.netHTTP = true
				return b.client(t, timeout)
			}},
		{name: "twilio", permanentCode: "twilio_21211",
			new: func(t *testing.T, b *bundle, timeout time.Duration) provider.Looker { return b.twilio(t, timeout, nil) }},
		{name: "twilio over net/http", permanentCode: "twilio_21211",
			new: func(t *testing.T, b *bundle, timeout time.Duration) provider.Looker {
				b.netHTTP = true
				return b.twilio(t, timeout, nil)
			}},
	}
}

func (b *bundle) twilio(t testing.TB, timeout time.Duration, edit func(*sms.TwilioConfig)) *sms.TwilioClient {
	t.Helper()
	cfg := sms.TwilioConfig{URL: b.url, AccountSID: testAccount, AuthToken: testToken, From: "+15005550006",
		Timeout: timeout, HTTPClient: b.httpClient()}
	if edit != nil {
		edit(&cfg)
	}
	c, err := sms.NewTwilio(cfg)
	require.NoError(t, err)
	return c
}

// earlier is an unknown attempt started a moment ago.
func earlier(msg provider.Message) provider.Message {
	msg.Earlier = []provider.Earlier{{AttemptID: 1, Started: time.Now().Add(-time.Second)}}
	return msg
}

func TestAdapterSuite(t *testing.T) {
	t.Parallel()
	for _, a := range adapters() {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			suite(t, a)
		})
	}
}

func suite(t *testing.T, a adapter) {
	fake := func(t *testing.T, outcomes ...fakesms.Outcome) *bundle {
		b := setup(t, fakesms.WithTwilioAccount(testAccount, testToken))
		require.NoError(t, b.fake.SetConfig(fakesms.Config{RetryAfterSeconds: 7, Script: outcomes}))
		return b
	}

	t.Run("accept then lookup finds it", func(t *testing.T) {
		t.Parallel()
		b := fake(t)
		c := a.new(t, b, 5*time.Second)
		id, err := c.Send(t.Context(), message("k-accept"))
		require.NoError(t, err)
		require.NotEmpty(t, id)
		found, err := c.Lookup(t.Context(), earlier(message("k-accept")))
		require.NoError(t, err)
		require.Equal(t, id, found)
		require.Len(t, b.fake.Messages(), 1)
	})

	t.Run("429 is retryable with Retry-After", func(t *testing.T) {
		t.Parallel()
		b := fake(t, "429")
		_, err := a.new(t, b, 5*time.Second).Send(t.Context(), message("k-429"))
		pe := requireSendError(t, err, provider.Retryable, "http_429")
		require.Equal(t, 7*time.Second, pe.RetryAfter)
		require.Empty(t, b.fake.Messages())
	})

	t.Run("5xx is retryable", func(t *testing.T) {
		t.Parallel()
		b := fake(t, "503")
		_, err := a.new(t, b, 5*time.Second).Send(t.Context(), message("k-503"))
		pe := requireSendError(t, err, provider.Retryable, "http_503")
		require.Equal(t, "retryable", string(pe.Outcome()), "the provider answered: nothing was sent")
		require.Empty(t, b.fake.Messages())
	})

	t.Run("4xx is permanent", func(t *testing.T) {
		t.Parallel()
		b := fake(t, "400")
		_, err := a.new(t, b, 5*time.Second).Send(t.Context(), message("k-400"))
		requireSendError(t, err, provider.Permanent, a.permanentCode)
		require.Empty(t, b.fake.Messages())
	})

	t.Run("timeout after accept: lookup finds it, nothing sent twice", func(t *testing.T) {
		t.Parallel()
		b := fake(t, fakesms.TimeoutAfterAccept)
		c := a.new(t, b, 300*time.Millisecond)
		_, err := c.Send(t.Context(), message("k-timeout"))
		pe := requireSendError(t, err, provider.Retryable, "timeout")
		require.Equal(t, "unknown", string(pe.Outcome()))
		require.Len(t, b.fake.Messages(), 1, "the provider accepted before the client gave up")

		id, err := c.Lookup(t.Context(), earlier(message("k-timeout")))
		require.NoError(t, err)
		require.Equal(t, b.fake.Messages()[0].ID, id)
		require.Len(t, b.fake.Messages(), 1, "the lookup created nothing")
		require.Equal(t, 1, b.fake.Stats().Accepted)
	})

	t.Run("lookup of a message never accepted", func(t *testing.T) {
		t.Parallel()
		b := fake(t)
		c := a.new(t, b, 5*time.Second)
		_, err := c.Send(t.Context(), message("k-other")) // another reminder, same recipient
		require.NoError(t, err)
		_, err = c.Lookup(t.Context(), earlier(message("k-never")))
		require.ErrorIs(t, err, provider.ErrNotFound)
		require.Positive(t, b.fake.Stats().Lookups)
	})

	t.Run("lookup while the provider fails is not a conclusion", func(t *testing.T) {
		t.Parallel()
		down := cannedServer(t, func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		c := a.new(t, &bundle{url: down, http: http.DefaultClient}, 5*time.Second)
		_, err := c.Lookup(t.Context(), earlier(message("k-x")))
		pe := requireSendError(t, err, provider.Retryable, "http_503")
		require.False(t, errors.Is(err, provider.ErrNotFound), "a failed lookup must not read as not found: %v", pe)
	})
}

func TestTwilioRequestShape(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			twilioRequestShape(t, tr.http())
		})
	}
}

func twilioRequestShape(t *testing.T, hc *http.Client) {
	var got *http.Request
	var form map[string][]string
	url := cannedServer(t, func(w http.ResponseWriter, r *http.Request) {
		require.NoError(t, r.ParseForm())
		got, form = r, r.PostForm
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"sid":"SM123","status":"queued"}`))
	})
	c, err := sms.NewTwilio(sms.TwilioConfig{URL: url, AccountSID: testAccount, AuthToken: testToken,
		MessagingServiceSID: "MG1", StatusCallback: "https://hooks.example.com/twilio?x=1", HTTPClient: hc})
	require.NoError(t, err)
	id, err := c.Send(t.Context(), message("k-shape"))
	require.NoError(t, err)
	require.Equal(t, "SM123", id)
	require.Equal(t, "/2010-04-01/Accounts/"+testAccount+"/Messages.json", got.URL.Path)
	user, pass, ok := got.BasicAuth()
	require.True(t, ok)
	require.Equal(t, []string{testAccount, testToken}, []string{user, pass})
	require.Equal(t, "application/x-www-form-urlencoded", got.Header.Get("Content-Type"))
	require.Equal(t, "+15555550100", form["To"][0])
	require.Equal(t, "MG1", form["MessagingServiceSid"][0])
	require.NotContains(t, form, "From")
	ref := sms.Reference("k-shape")
	require.True(t, strings.HasSuffix(form["Body"][0], "\n"+ref), "body %q ends with the reference", form["Body"][0])
	require.Equal(t, "https://hooks.example.com/twilio?nudge_ref="+strings.TrimPrefix(ref, "ref ")+"&x=1",
		form["StatusCallback"][0])
}

func TestTwilioRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		status   int
		body     string
		kind     provider.Kind
		code     string
		retryIn  time.Duration
		outcomes string
	}{
		{"invalid number", 400, `{"code":21211,"message":"The 'To' number 123 is not a valid phone number.","status":400}`,
			provider.Permanent, "twilio_21211", 0, "permanent"},
		{"unsubscribed", 400, `{"code":21610,"message":"Attempt to send to unsubscribed recipient","status":400}`,
			provider.Permanent, "twilio_21610", 0, "permanent"},
		{"bad credentials", 401, `{"code":20003,"message":"Authenticate","status":401}`,
			provider.Permanent, "twilio_20003", 0, "permanent"},
		{"too many requests", 429, `{"code":20429,"message":"Too Many Requests","status":429}`,
			provider.Retryable, "http_429", 3 * time.Second, "retryable"},
		{"server error", 503, `{"code":20503,"message":"Service Unavailable","status":503}`,
			provider.Retryable, "http_503", 3 * time.Second, "retryable"},
		{"no JSON", 502, `<html>bad gateway</html>`, provider.Retryable, "http_502", 3 * time.Second, "retryable"},
		{"created without sid", 201, `{"status":"queued"}`, provider.Retryable, "bad_response", 0, "unknown"},
	}
	for _, tr := range transports {
		for _, tt := range tests {
			t.Run(tr.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				url := cannedServer(t, func(w http.ResponseWriter, _ *http.Request) {
					w.Header().Set("Retry-After", "3")
					w.WriteHeader(tt.status)
					_, _ = w.Write([]byte(tt.body))
				})
				c, err := sms.NewTwilio(sms.TwilioConfig{URL: url, AccountSID: testAccount, AuthToken: testToken, From: "+15005550006",
					HTTPClient: tr.http()})
				require.NoError(t, err)
				_, err = c.Send(t.Context(), message("k"))
				pe := requireSendError(t, err, tt.kind, tt.code)
				require.Equal(t, tt.outcomes, string(pe.Outcome()))
				if tt.kind == provider.Retryable {
					require.Equal(t, tt.retryIn, pe.RetryAfter)
				}
				require.NotContains(t, err.Error(), testToken)
			})
		}
	}
}

func TestTwilioInvalidNumberAtTheFake(t *testing.T) {
	t.Parallel()
	b := setup(t, fakesms.WithTwilioAccount(testAccount, testToken))
	msg := message("k-bad-number")
	msg.Recipient = "0800 123"
	_, err := b.twilio(t, 5*time.Second, nil).Send(t.Context(), msg)
	requireSendError(t, err, provider.Permanent, "twilio_21211")

	wrong := b.twilio(t, 5*time.Second, func(c *sms.TwilioConfig) { c.AuthToken = "wrong" })
	_, err = wrong.Send(t.Context(), message("k-auth"))
	requireSendError(t, err, provider.Permanent, "twilio_20003")
	require.Empty(t, b.fake.Messages())
}

// Twilio does not deduplicate: two creates are two messages, which is why
// the worker looks up before retrying an unknown outcome.
func TestTwilioRepeatedCreateIsASecondMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.twilio(t, 5*time.Second, nil)
	for range 2 {
		_, err := c.Send(t.Context(), message("k-twice"))
		require.NoError(t, err)
	}
	require.Len(t, b.fake.Messages(), 2)
}

func TestTwilioLookupPagesAndWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.twilio(t, 5*time.Second, nil)
	_, err := c.Send(t.Context(), message("k-target"))
	require.NoError(t, err)
	for i := range 120 { // newer messages to the same phone, over three pages
		_, err := c.Send(t.Context(), message("k-noise-"+string(rune('a'+i%26))+string(rune('a'+i/26))))
		require.NoError(t, err)
	}
	id, err := c.Lookup(t.Context(), earlier(message("k-target")))
	require.NoError(t, err)
	require.Equal(t, b.fake.Messages()[0].ID, id)

	// An attempt that started after every message: the window excludes them.
	late := message("k-target")
	late.Earlier = []provider.Earlier{{Started: time.Now().Add(time.Hour)}}
	_, err = c.Lookup(t.Context(), late)
	require.ErrorIs(t, err, provider.ErrNotFound)
}

func TestTwilioLookupBySIDAndUndelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.fake.Enqueue(fakesms.AcceptUndelivered))
	c := b.twilio(t, 5*time.Second, nil)
	sid, err := c.Send(t.Context(), message("k-undelivered"))
	require.NoError(t, err)

	msg := message("k-undelivered")
	msg.Earlier = []provider.Earlier{{ProviderID: sid, Started: time.Now()}}
	_, err = c.Lookup(t.Context(), msg)
	requireSendError(t, err, provider.Permanent, "twilio_30003")

	msg.Earlier[0].ProviderID = "SM00000000000000000000000000000999"
	_, err = c.Lookup(t.Context(), msg)
	requireSendError(t, err, provider.Permanent, "twilio_30003") // not by SID: by the reference, then judged
}

func TestNewTwilioValidates(t *testing.T) {
	t.Parallel()
	base := sms.TwilioConfig{AccountSID: testAccount, AuthToken: testToken, From: "+15005550006"}
	tests := []struct {
		name string
		edit func(*sms.TwilioConfig)
	}{
		{"no account", func(c *sms.TwilioConfig) { c.AccountSID = "" }},
		{"no token", func(c *sms.TwilioConfig) { c.AuthToken = "" }},
		{"no sender", func(c *sms.TwilioConfig) { c.From = "" }},
		{"two senders", func(c *sms.TwilioConfig) { c.MessagingServiceSID = "MG1" }},
		{"bad url", func(c *sms.TwilioConfig) { c.URL = "ftp://x" }},
		{"bad callback", func(c *sms.TwilioConfig) { c.StatusCallback = "/relative" }},
		{"negative timeout", func(c *sms.TwilioConfig) { c.Timeout = -1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base
			tt.edit(&cfg)
			_, err := sms.NewTwilio(cfg)
			require.ErrorIs(t, err, sms.ErrInvalidConfig)
			require.NotContains(t, err.Error(), testToken)
		})
	}
	_, err := sms.NewTwilio(base)
	require.NoError(t, err)
}
