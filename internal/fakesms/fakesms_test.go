package fakesms_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fakesms"
)

// These tests speak plain HTTP to the fake; internal/sms runs the real client
// against it.

type bundle struct {
	fake *fakesms.Server
	url  string
	http *http.Client
}

func setup(t *testing.T, opts ...fakesms.Option) *bundle {
	t.Helper()
	fake := fakesms.New(opts...)
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	t.Cleanup(fake.Close)
	return &bundle{fake: fake, url: ts.URL, http: ts.Client()}
}

type response struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (b *bundle) do(t *testing.T, method, path string, header map[string]string, body string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, b.url+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := b.http.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := response{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &r.body)
	return r
}

func (b *bundle) send(t *testing.T, key, to, body string) response {
	t.Helper()
	h := map[string]string{"Content-Type": "application/json"}
	if key != "" {
		h["Idempotency-Key"] = key
	}
	payload, err := json.Marshal(map[string]string{"to": to, "body": body, "tenant": "acme", "reference": "9"})
	require.NoError(t, err)
	return b.do(t, http.MethodPost, "/v1/messages", h, string(payload))
}

func TestSendValidation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		header map[string]string
		body   string
		errSub string
	}{
		{"no idempotency key", nil, `{"to":"+1","body":"hi"}`, "Idempotency-Key"},
		{"not JSON", map[string]string{"Idempotency-Key": "k"}, `{"to":`, "invalid JSON"},
		{"no to", map[string]string{"Idempotency-Key": "k"}, `{"body":"hi"}`, `"to"`},
		{"no body", map[string]string{"Idempotency-Key": "k"}, `{"to":"+1"}`, `"body"`},
		{"empty body", map[string]string{"Idempotency-Key": "k"}, `{"to":"+1","body":""}`, `"body"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, fakesms.WithConfig(fakesms.Config{Script: []fakesms.Outcome{"503"}}))
			r := b.do(t, http.MethodPost, "/v1/messages", tt.header, tt.body)
			require.Equal(t, http.StatusBadRequest, r.status, r.raw)
			require.Contains(t, r.body["error"], tt.errSub)

			attempts := b.fake.Attempts()
			require.Len(t, attempts, 1, "invalid requests are recorded")
			require.Equal(t, http.StatusBadRequest, attempts[0].Status)
			require.NotEmpty(t, attempts[0].Error)
			require.Empty(t, b.fake.Messages())
			require.Equal(t, []fakesms.Outcome{"503"}, b.fake.Config().Script, "invalid requests do not consume the script")
		})
	}
}

func TestSendRequiresToken(t *testing.T) {
	t.Parallel()
	b := setup(t, fakesms.WithToken("t0k"))
	r := b.send(t, "k", "+1", "hi")
	require.Equal(t, http.StatusUnauthorized, r.status)

	r = b.do(t, http.MethodPost, "/v1/messages",
		map[string]string{"Idempotency-Key": "k", "Authorization": "Bearer t0k"}, `{"to":"+1","body":"hi"}`)
	require.Equal(t, http.StatusCreated, r.status, r.raw)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/stats", nil, "").status, "the control API stays open")
}

func TestSendDeduplicatesOnKey(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	b := setup(t, fakesms.WithClock(clock.NewFake(now)))

	first := b.send(t, "rem-1", "+15555550100", "hello")
	require.Equal(t, http.StatusCreated, first.status, first.raw)
	require.Equal(t, "accepted", first.body["status"])
	id, _ := first.body["id"].(string)
	require.True(t, strings.HasPrefix(id, "sms_"), id)
	require.NotContains(t, first.body, "duplicate")

	second := b.send(t, "rem-1", "+15555550100", "hello again")
	require.Equal(t, http.StatusOK, second.status, second.raw)
	require.Equal(t, id, second.body["id"])
	require.Equal(t, true, second.body["duplicate"])

	other := b.send(t, "rem-2", "+15555550101", "other")
	require.Equal(t, http.StatusCreated, other.status)
	require.NotEqual(t, id, other.body["id"])

	msgs := b.fake.Messages()
	require.Len(t, msgs, 2)
	require.Equal(t, fakesms.Message{
		ID: id, API: fakesms.APIGeneric, IdempotencyKey: "rem-1", To: "+15555550100", Body: "hello",
		Tenant: "acme", Reference: "9", Status: "accepted", AcceptedAt: now, Attempts: 2,
	}, msgs[0])

	attempts := b.fake.Attempts()
	require.Len(t, attempts, 3)
	require.Equal(t, fakesms.Attempt{
		Seq: 2, Time: now, API: fakesms.APIGeneric, IdempotencyKey: "rem-1", To: "+15555550100", Body: "hello again",
		Tenant: "acme", Reference: "9", Status: http.StatusOK, Duplicate: true, MessageID: id,
	}, attempts[1])

	st := b.fake.Stats()
	require.Equal(t, 3, st.Attempts)
	require.Equal(t, 2, st.Accepted)
	require.Equal(t, 1, st.Duplicates)
	require.Equal(t, map[int]int{201: 2, 200: 1}, st.ByStatus)
}

func TestSendConcurrentSameKeyAcceptsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 50
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		ids      = map[any]bool{}
	)
	for range n {
		wg.Go(func() {
			r := b.send(t, "race", "+1", "hi")
			mu.Lock()
			defer mu.Unlock()
			statuses[r.status]++
			ids[r.body["id"]] = true
		})
	}
	wg.Wait()
	require.Equal(t, map[int]int{201: 1, 200: n - 1}, statuses)
	require.Len(t, ids, 1)
	msgs := b.fake.Messages()
	require.Len(t, msgs, 1)
	require.Equal(t, n, msgs[0].Attempts)
}

func TestInjectedStatuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		cfg        fakesms.Config
		wantStatus int
		retryAfter string
	}{
		{"429 with Retry-After", fakesms.Config{RetryAfterSeconds: 9, Script: []fakesms.Outcome{"429"}}, 429, "9"},
		{"429 without Retry-After", fakesms.Config{Script: []fakesms.Outcome{"429"}}, 429, ""},
		{"scripted 502", fakesms.Config{Script: []fakesms.Outcome{"502"}}, 502, ""},
		{"scripted 422", fakesms.Config{Script: []fakesms.Outcome{"422"}}, 422, ""},
		{"rate 5xx", fakesms.Config{Rate5xx: 1}, 503, ""},
		{"rate 4xx", fakesms.Config{Rate4xx: 1}, 400, ""},
		{"rate 429", fakesms.Config{Rate429: 1, RetryAfterSeconds: 2}, 429, "2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, fakesms.WithConfig(tt.cfg))
			r := b.send(t, "k", "+1", "hi")
			require.Equal(t, tt.wantStatus, r.status, r.raw)
			require.Equal(t, tt.retryAfter, r.header.Get("Retry-After"))
			require.Contains(t, r.body["error"], "injected")
			require.Empty(t, b.fake.Messages())
			a := b.fake.Attempts()
			require.Len(t, a, 1)
			require.Equal(t, fmt.Sprint(tt.wantStatus), a[0].Fault)
			require.Equal(t, len(tt.cfg.Script) > 0, a[0].Scripted)
		})
	}
}

func TestTimeoutOutcomes(t *testing.T) {
	t.Parallel()

	t.Run("timeout_after_accept answers late", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fakesms.WithConfig(fakesms.Config{Stall: 100 * time.Millisecond, Script: []fakesms.Outcome{fakesms.TimeoutAfterAccept}}))
		start := time.Now()
		r := b.send(t, "k", "+1", "hi")
		require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)
		require.Equal(t, http.StatusCreated, r.status)
		require.Len(t, b.fake.Messages(), 1)
		require.Equal(t, "timeout_after_accept", b.fake.Attempts()[0].Fault)
	})

	t.Run("timeout answers 504 without accepting", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fakesms.WithConfig(fakesms.Config{Stall: 50 * time.Millisecond, Script: []fakesms.Outcome{fakesms.Timeout}}))
		r := b.send(t, "k", "+1", "hi")
		require.Equal(t, http.StatusGatewayTimeout, r.status)
		require.Empty(t, b.fake.Messages())
	})

	t.Run("Close releases a hanging handler", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fakesms.WithConfig(fakesms.Config{Script: []fakesms.Outcome{fakesms.TimeoutAfterAccept}}))
		done := make(chan response, 1)
		go func() { done <- b.send(t, "k", "+1", "hi") }()
		require.Eventually(t, func() bool { return len(b.fake.Messages()) == 1 }, 5*time.Second, 5*time.Millisecond)
		select {
		case <-done:
			t.Fatal("a zero Stall must hang until the client leaves or Close")
		case <-time.After(100 * time.Millisecond):
		}
		b.fake.Close()
		select {
		case r := <-done:
			require.Equal(t, http.StatusCreated, r.status)
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not release the stalled handler")
		}
	})
}

func TestSeedMakesOutcomesReproducible(t *testing.T) {
	t.Parallel()
	cfg := fakesms.Config{Rate429: 0.25, Rate5xx: 0.25, Rate4xx: 0.25, Seed: 99}
	run := func(opts ...fakesms.Option) []int {
		b := setup(t, opts...)
		var got []int
		for i := range 60 {
			got = append(got, b.send(t, fmt.Sprint(i), "+1", "hi").status)
		}
		return got
	}
	first := run(fakesms.WithConfig(cfg))
	require.Equal(t, first, run(fakesms.WithConfig(cfg)))
	require.Subset(t, first, []int{201, 400, 429, 503})
	cfg.Seed = 100
	require.NotEqual(t, first, run(fakesms.WithConfig(cfg)))
	require.Equal(t, first, run(fakesms.WithConfig(fakesms.Config{Rate429: 0.25, Rate5xx: 0.25, Rate4xx: 0.25}), fakesms.WithSeed(99)))
}

func TestControlAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)

	r := b.do(t, http.MethodGet, "/control", nil, "")
	require.Equal(t, http.StatusOK, r.status)
	require.JSONEq(t, `{"rate_429":0,"rate_5xx":0,"rate_4xx":0,"rate_timeout_after_accept":0,
		"delay":"0s","stall":"0s","retry_after":0,"seed":0,"script":[]}`, r.raw)

	put := `{"rate_429":0.1,"rate_5xx":0.2,"rate_4xx":0.05,"rate_timeout_after_accept":0.01,
		"delay":"20ms","stall":"3s","retry_after":4,"seed":7,"script":["429","accept"]}`
	r = b.do(t, http.MethodPut, "/control", nil, put)
	require.Equal(t, http.StatusOK, r.status, r.raw)
	require.JSONEq(t, put, r.raw)
	require.Equal(t, fakesms.Config{
		Rate429: 0.1, Rate5xx: 0.2, Rate4xx: 0.05, RateTimeoutAfterAccept: 0.01,
		Delay: 20 * time.Millisecond, Stall: 3 * time.Second, RetryAfterSeconds: 4, Seed: 7,
		Script: []fakesms.Outcome{"429", fakesms.Accept},
	}, b.fake.Config())

	require.Equal(t, 429, b.send(t, "a", "+1", "hi").status)
	require.Equal(t, 201, b.send(t, "b", "+1", "hi").status)
	require.JSONEq(t, `[]`, mustJSON(t, b.fake.Config().Script), "the script is consumed")

	var msgs []fakesms.Message
	r = b.do(t, http.MethodGet, "/messages", nil, "")
	require.NoError(t, json.Unmarshal([]byte(r.raw), &msgs))
	require.Len(t, msgs, 1)
	require.Equal(t, "b", msgs[0].IdempotencyKey)

	var attempts []fakesms.Attempt
	r = b.do(t, http.MethodGet, "/attempts", nil, "")
	require.NoError(t, json.Unmarshal([]byte(r.raw), &attempts))
	require.Len(t, attempts, 2)
	require.Equal(t, "429", attempts[0].Fault)

	r = b.do(t, http.MethodGet, "/stats", nil, "")
	require.JSONEq(t, `{"attempts":2,"accepted":1,"lookups":0,"duplicates":0,"client_gone":0,
		"by_status":{"201":1,"429":1},"by_fault":{"429":1}}`, r.raw)

	r = b.do(t, http.MethodPost, "/reset", nil, "")
	require.Equal(t, http.StatusNoContent, r.status)
	require.Equal(t, fakesms.Config{}, b.fake.Config())
	require.Empty(t, b.fake.Messages())
	require.Empty(t, b.fake.Attempts())
	again := b.send(t, "b", "+1", "hi")
	require.Equal(t, http.StatusCreated, again.status, "reset forgets idempotency keys")
	require.NotEqual(t, msgs[0].ID, again.body["id"], "ids are not reused after reset")

	r = b.do(t, http.MethodGet, "/healthz", nil, "")
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, http.StatusMethodNotAllowed, b.do(t, http.MethodDelete, "/control", nil, "").status)
	require.Equal(t, http.StatusMethodNotAllowed, b.do(t, http.MethodGet, "/v1/messages", nil, "").status)
}

func TestControlRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, errSub string
	}{
		{"rate above 1", `{"rate_429":1.5}`, "rate_429"},
		{"negative rate", `{"rate_5xx":-0.1}`, "rate_5xx"},
		{"rates sum above 1", `{"rate_429":0.6,"rate_5xx":0.6}`, "sum"},
		{"unknown field", `{"rate_503":0.1}`, "unknown field"},
		{"bad duration", `{"delay":"soon"}`, "delay"},
		{"negative stall", `{"stall":"-1s"}`, "stall"},
		{"negative retry_after", `{"retry_after":-1}`, "retry_after"},
		{"unknown outcome", `{"script":["accept","drop"]}`, "script[1]"},
		{"status out of range", `{"script":["200"]}`, "script[0]"},
		{"not JSON", `rate_429=1`, "invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, fakesms.WithConfig(fakesms.Config{Rate4xx: 0.5}))
			r := b.do(t, http.MethodPut, "/control", nil, tt.body)
			require.Equal(t, http.StatusBadRequest, r.status, r.raw)
			require.Contains(t, r.body["error"], tt.errSub)
			require.Equal(t, fakesms.Config{Rate4xx: 0.5}, b.fake.Config(), "a rejected config changes nothing")
		})
	}
}

func TestOutcomeValidate(t *testing.T) {
	t.Parallel()
	for _, o := range []fakesms.Outcome{"accept", "timeout_after_accept", "timeout", "400", "429", "503", "599"} {
		require.NoError(t, o.Validate(), "%q", o)
	}
	for _, o := range []fakesms.Outcome{"", "ACCEPT", "200", "399", "600", "4xx", "+429", "0429"} {
		require.Error(t, o.Validate(), "%q", o)
	}
}

func TestEnqueueAndHook(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seen []fakesms.Attempt
	)
	b := setup(t, fakesms.WithAttemptHook(func(a fakesms.Attempt) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, a)
	}))
	require.Error(t, b.fake.Enqueue("accept", "nope"))
	require.Empty(t, b.fake.Config().Script, "a rejected Enqueue adds nothing")
	require.NoError(t, b.fake.Enqueue("500"))
	require.NoError(t, b.fake.Enqueue(fakesms.Accept))

	require.Equal(t, 500, b.send(t, "k", "+1", "hi").status)
	require.Equal(t, 201, b.send(t, "k", "+1", "hi").status)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, seen, 2)
	require.Equal(t, 500, seen[0].Status)
	require.True(t, seen[0].Scripted)
	require.Equal(t, 201, seen[1].Status)
	require.NotEmpty(t, seen[1].MessageID)
}

func TestSetConfigValidates(t *testing.T) {
	t.Parallel()
	s := fakesms.New()
	require.Error(t, s.SetConfig(fakesms.Config{Delay: -time.Second}))
	require.NoError(t, s.SetConfig(fakesms.Config{Delay: time.Millisecond}))
	require.Equal(t, time.Millisecond, s.Config().Delay)
	require.Panics(t, func() { fakesms.WithConfig(fakesms.Config{Rate429: 2}) })
}

func TestConfigJSONRoundTrip(t *testing.T) {
	t.Parallel()
	in := fakesms.Config{Rate429: 0.3, Delay: 1500 * time.Millisecond, RetryAfterSeconds: 1, Seed: 1 << 60, Script: []fakesms.Outcome{"timeout"}}
	var out fakesms.Config
	require.NoError(t, json.Unmarshal([]byte(mustJSON(t, in)), &out))
	require.Equal(t, in, out)

	require.NoError(t, json.Unmarshal([]byte(`{}`), &out))
	require.Equal(t, fakesms.Config{}, out, "omitted fields are zero")
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, json.NewEncoder(&buf).Encode(v))
	return buf.String()
}
