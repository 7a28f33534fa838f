package sms_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
)

// The behavioural suite runs the real client against the fake provider over
// real HTTP on loopback: what the worker relies on (classification, Retry-After,
// dedup across an unknown outcome) is checked end to end.

type bundle struct {
	fake *fakesms.Server
	url  string
	http *http.Client
	// netHTTP has the generic and the Twilio client send through http
	// (net/http's client) rather than their default, the direct client.
	netHTTP bool
}

// httpClient is the clients' Config.HTTPClient (TwilioConfig.HTTPClient):
// nil (the direct client) unless b.netHTTP.
func (b *bundle) httpClient() *http.Client {
	if b.netHTTP {
		return b.http
	}
	return nil
}

func setup(t testing.TB, opts ...fakesms.Option) *bundle {
	t.Helper()
	fake := fakesms.New(opts...)
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	t.Cleanup(fake.Close) // runs first: releases stalled handlers so ts.Close returns
	return &bundle{fake: fake, url: ts.URL, http: ts.Client()}
}

func (b *bundle) client(t testing.TB, timeout time.Duration) *sms.Client {
	t.Helper()
	c, err := sms.New(sms.Config{URL: b.url, Timeout: timeout, Sender: "Nudge", HTTPClient: b.httpClient()})
	require.NoError(t, err)
	return c
}

func message(key string) provider.Message {
	return provider.Message{
		ReminderID:     42,
		IdempotencyKey: key,
		Tenant:         "acme",
		Recipient:      "+15555550100",
		Template:       "course-expiry",
		Data:           map[string]any{"learner": "Ada", "course": "Go 101", "reminder_id": "caller data loses"},
		Deadline:       time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC),
	}
}

// requireSendError asserts err is a *provider.Error of kind and code.
func requireSendError(t *testing.T, err error, kind provider.Kind, code string) *provider.Error {
	t.Helper()
	require.Error(t, err)
	var pe *provider.Error
	require.True(t, errors.As(err, &pe), "want *provider.Error, got %T: %v", err, err)
	require.Equal(t, kind, pe.Kind, "kind of %v", err)
	require.Equal(t, code, pe.Code, "code of %v", err)
	return pe
}

func TestSendAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t, fakesms.WithToken("s3cret"))
	c, err := sms.New(sms.Config{URL: b.url, Token: "s3cret", Sender: "Nudge", HTTPClient: b.httpClient()})
	require.NoError(t, err)

	id, err := c.Send(t.Context(), message("rem-42-v1"))
	require.NoError(t, err)
	require.NotEmpty(t, id)

	msgs := b.fake.Messages()
	require.Len(t, msgs, 1)
	got := msgs[0]
	require.Equal(t, id, got.ID)
	require.Equal(t, "rem-42-v1", got.IdempotencyKey)
	require.Equal(t, "+15555550100", got.To)
	require.Equal(t, "acme", got.Tenant)
	require.Equal(t, "42", got.Reference)
	require.Equal(t, "Nudge", got.From)
	require.Contains(t, got.Body, "Ada")
	require.Contains(t, got.Body, "Go 101")
	require.Equal(t, 1, got.Attempts)
}

func TestSendWrongTokenIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t, fakesms.WithToken("s3cret"))
	c, err := sms.New(sms.Config{URL: b.url, Token: "wrong", HTTPClient: b.httpClient()})
	require.NoError(t, err)

	_, err = c.Send(t.Context(), message("k"))
	requireSendError(t, err, provider.Permanent, "http_401")
	require.Empty(t, b.fake.Messages())
}

func TestSendSameKeyTwiceIsDeduplicated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, time.Second)

	id1, err := c.Send(t.Context(), message("same-key"))
	require.NoError(t, err)
	id2, err := c.Send(t.Context(), message("same-key"))
	require.NoError(t, err)
	require.Equal(t, id1, id2)

	msgs := b.fake.Messages()
	require.Len(t, msgs, 1)
	require.Equal(t, 2, msgs[0].Attempts)
	attempts := b.fake.Attempts()
	require.Len(t, attempts, 2)
	require.False(t, attempts[0].Duplicate)
	require.Equal(t, http.StatusCreated, attempts[0].Status)
	require.True(t, attempts[1].Duplicate)
	require.Equal(t, http.StatusOK, attempts[1].Status)
	require.Equal(t, id1, attempts[1].MessageID)
	require.Equal(t, 1, b.fake.Stats().Duplicates)
}

func TestSendRateLimitedHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t, fakesms.WithConfig(fakesms.Config{RetryAfterSeconds: 7, Script: []fakesms.Outcome{"429"}}))

	_, err := b.client(t, time.Second).Send(t.Context(), message("k"))
	pe := requireSendError(t, err, provider.Retryable, "http_429")
	require.Equal(t, 7*time.Second, pe.RetryAfter)
	require.Empty(t, b.fake.Messages())
}

func TestSendServerErrorIsRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t, fakesms.WithConfig(fakesms.Config{Script: []fakesms.Outcome{"503"}}))

	_, err := b.client(t, time.Second).Send(t.Context(), message("k"))
	pe := requireSendError(t, err, provider.Retryable, "http_503")
	require.Zero(t, pe.RetryAfter)
	require.Empty(t, b.fake.Messages())
}

func TestSendBadRequestIsPermanentAndNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, fakesms.WithConfig(fakesms.Config{Script: []fakesms.Outcome{"400"}}))

	_, err := b.client(t, time.Second).Send(t.Context(), message("k"))
	requireSendError(t, err, provider.Permanent, "http_400")
	require.Contains(t, err.Error(), "injected", "error should quote the response body")
	require.Len(t, b.fake.Attempts(), 1, "the client must not retry on its own")
	require.Empty(t, b.fake.Messages())
}

// Regression for the failure that makes idempotency keys necessary: the
// provider accepts, the client times out not knowing, the worker retries.
func TestSendTimeoutAfterAcceptThenRetryDeduplicates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		stall time.Duration // 0: hang until the client leaves
	}{
		{"hangs until client leaves", 0},
		{"stalls past the client timeout", 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, fakesms.WithConfig(fakesms.Config{
				Stall:  tt.stall,
				Script: []fakesms.Outcome{fakesms.TimeoutAfterAccept},
			}))
			c := b.client(t, 200*time.Millisecond)

			start := time.Now()
			_, err := c.Send(t.Context(), message("rem-7"))
			requireSendError(t, err, provider.Retryable, "timeout")
			require.Less(t, time.Since(start), 1500*time.Millisecond, "the client timeout should cut the wait")

			msgs := b.fake.Messages()
			require.Len(t, msgs, 1, "the provider accepted before stalling")
			require.Eventually(t, func() bool { return b.fake.Attempts()[0].ClientGone }, 5*time.Second, 10*time.Millisecond)

			id, err := c.Send(t.Context(), message("rem-7"))
			require.NoError(t, err)
			require.Equal(t, msgs[0].ID, id, "the retry returns the id of the message accepted earlier")

			msgs = b.fake.Messages()
			require.Len(t, msgs, 1, "exactly one accepted message after the retry")
			require.Equal(t, 2, msgs[0].Attempts)
			attempts := b.fake.Attempts()
			require.Len(t, attempts, 2)
			require.Equal(t, string(fakesms.TimeoutAfterAccept), attempts[0].Fault)
			require.True(t, attempts[1].Duplicate)
		})
	}
}

func TestSendDelay(t *testing.T) {
	t.Parallel()

	t.Run("below the timeout succeeds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fakesms.WithConfig(fakesms.Config{Delay: 50 * time.Millisecond}))
		start := time.Now()
		id, err := b.client(t, 2*time.Second).Send(t.Context(), message("k"))
		require.NoError(t, err)
		require.NotEmpty(t, id)
		require.GreaterOrEqual(t, time.Since(start), 50*time.Millisecond)
	})

	t.Run("above the timeout times out before acceptance", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fakesms.WithConfig(fakesms.Config{Delay: 5 * time.Second}))
		_, err := b.client(t, 100*time.Millisecond).Send(t.Context(), message("k"))
		requireSendError(t, err, provider.Retryable, "timeout")
		require.Eventually(t, func() bool {
			a := b.fake.Attempts()
			return len(a) == 1 && a[0].ClientGone && a[0].Status == 499
		}, 5*time.Second, 10*time.Millisecond)
		require.Empty(t, b.fake.Messages())
	})
}

func TestSendUnknownTemplateSendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg := message("k")
	msg.Template = "no-such-template"

	_, err := b.client(t, time.Second).Send(t.Context(), msg)
	requireSendError(t, err, provider.Permanent, "template")
	require.ErrorIs(t, err, sms.ErrUnknownTemplate)
	require.Empty(t, b.fake.Attempts(), "nothing may reach the provider")
}

func TestSendFollowsScriptInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, fakesms.WithConfig(fakesms.Config{
		RetryAfterSeconds: 3,
		Script:            []fakesms.Outcome{"429", "503", fakesms.Accept, "400", "500"},
	}))
	c := b.client(t, time.Second)

	type result struct {
		kind provider.Kind
		code string // "" for success
	}
	want := []result{
		{provider.Retryable, "http_429"},
		{provider.Retryable, "http_503"},
		{0, ""},
		{provider.Permanent, "http_400"},
		{provider.Retryable, "http_500"},
		{0, ""}, // script exhausted, no rates: accept
	}
	for i, w := range want {
		_, err := c.Send(t.Context(), message(fmt.Sprintf("key-%d", i)))
		if w.code == "" {
			require.NoError(t, err, "send %d", i)
			continue
		}
		requireSendError(t, err, w.kind, w.code)
	}
	require.Len(t, b.fake.Messages(), 2)
	require.Empty(t, b.fake.Config().Script)
}

func TestSendSeededProbabilities(t *testing.T) {
	t.Parallel()
	const n = 2000
	cfg := fakesms.Config{Rate429: 0.10, Rate5xx: 0.15, Rate4xx: 0.05, Seed: 20240601}
	b := setup(t, fakesms.WithConfig(cfg))
	c := b.client(t, 5*time.Second)

	var (
		mu     sync.Mutex
		counts = map[string]int{}
		wg     sync.WaitGroup
		keys   = make(chan int)
	)
	for range 8 {
		wg.Go(func() {
			for i := range keys {
				_, err := c.Send(context.Background(), message(fmt.Sprintf("p-%d", i)))
				code := "ok"
				if err != nil {
					code = provider.Classify(err).Code
				}
				mu.Lock()
				counts[code]++
				mu.Unlock()
			}
		})
	}
	for i := range n {
		keys <- i
	}
	close(keys)
	wg.Wait()

	// Four standard deviations of a binomial count: a correct generator
	// fails this about once in 15,000 seeds, and the seed is fixed.
	within := func(code string, p float64) {
		t.Helper()
		want := p * n
		tol := 4 * math.Sqrt(n*p*(1-p))
		require.InDelta(t, want, counts[code], tol, "count of %s: %v", code, counts)
	}
	within("http_429", cfg.Rate429)
	within("http_503", cfg.Rate5xx)
	within("http_400", cfg.Rate4xx)
	within("ok", 1-cfg.Rate429-cfg.Rate5xx-cfg.Rate4xx)
	require.Equal(t, n, counts["ok"]+counts["http_429"]+counts["http_503"]+counts["http_400"], "%v", counts)

	st := b.fake.Stats()
	require.Equal(t, n, st.Attempts)
	require.Equal(t, counts["ok"], st.Accepted)
	require.Equal(t, counts["http_429"], st.ByStatus[429])
	require.Equal(t, counts["http_503"], st.ByStatus[503])
}

func TestSendSameSeedSameOutcomes(t *testing.T) {
	t.Parallel()
	cfg := fakesms.Config{Rate429: 0.2, Rate5xx: 0.2, Rate4xx: 0.1, Seed: 7}
	run := func() []string {
		b := setup(t, fakesms.WithConfig(cfg))
		c := b.client(t, time.Second)
		var codes []string
		for i := range 100 {
			_, err := c.Send(t.Context(), message(fmt.Sprintf("d-%d", i)))
			code := "ok"
			if err != nil {
				code = provider.Classify(err).Code
			}
			codes = append(codes, code)
		}
		return codes
	}
	first := run()
	require.Equal(t, first, run())
	require.Contains(t, first, "http_429")
	require.Contains(t, first, "ok")
}

// The cases below use a canned provider to reach responses the fake never
// gives.

func cannedServer(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

func TestSendRequestShape(t *testing.T) {
	t.Parallel()
	type captured struct {
		method, path, contentType, key, auth string
		body                                 map[string]any
	}
	got := make(chan captured, 1)
	url := cannedServer(t, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		raw, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(raw, &body)
		got <- captured{r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key"), r.Header.Get("Authorization"), body}
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"id":"prov-1","status":"queued"}`)
	})
	c, err := sms.New(sms.Config{URL: url + "/gateway/", Token: "tok", Sender: "NUDGE"})
	require.NoError(t, err)

	id, err := c.Send(t.Context(), message("rem-42-v3"))
	require.NoError(t, err)
	require.Equal(t, "prov-1", id)

	r := <-got
	require.Equal(t, http.MethodPost, r.method)
	require.Equal(t, "/gateway/v1/messages", r.path)
	require.Equal(t, "application/json", r.contentType)
	require.Equal(t, "rem-42-v3", r.key)
	require.Equal(t, "Bearer tok", r.auth)
	require.Equal(t, map[string]any{
		"to":        "+15555550100",
		"body":      "Hi Ada, your access to Go 101 expires on 31 Jan 2030. Finish your lessons before then to keep your progress.",
		"reference": "42",
		"tenant":    "acme",
		"from":      "NUDGE",
	}, r.body)
}

func TestSendNoTokenNoAuthorization(t *testing.T) {
	t.Parallel()
	auth := make(chan []string, 1)
	url := cannedServer(t, func(w http.ResponseWriter, r *http.Request) {
		auth <- r.Header.Values("Authorization")
		_, _ = io.WriteString(w, `{"id":"x"}`)
	})
	c, err := sms.New(sms.Config{URL: url})
	require.NoError(t, err)
	_, err = c.Send(t.Context(), message("k"))
	require.NoError(t, err)
	require.Empty(t, <-auth)
}

func TestSendResponseMapping(t *testing.T) {
	t.Parallel()
	long := "a" + strings.Repeat("é", 300) // the 200-byte cut falls inside a rune
	huge := strings.Repeat("x", 300<<10)
	padding := map[string]string{}
	for i := range 10 {
		padding[fmt.Sprintf("X-Padding-%d", i)] = strings.Repeat("p", 1000)
	}
	tests := []struct {
		name       string
		status     int
		header     map[string]string
		body       string
		wantID     string
		wantKind   provider.Kind
		wantCode   string
		wantAfter  time.Duration
		wantErrSub string
	}{
		{name: "200 with id", status: 200, body: `{"id":"a"}`, wantID: "a"},
		{name: "201 with id", status: 201, body: `{"id":"b","status":"accepted"}`, wantID: "b"},
		{name: "202 with id", status: 202, body: `{"id":"c"}`, wantID: "c"},
		{name: "2xx without id", status: 201, body: `{"status":"accepted"}`, wantKind: provider.Retryable, wantCode: "bad_response"},
		{name: "2xx not JSON", status: 200, body: `<html>`, wantKind: provider.Retryable, wantCode: "bad_response"},
		{name: "429 seconds", status: 429, header: map[string]string{"Retry-After": "12"}, wantKind: provider.Retryable, wantCode: "http_429", wantAfter: 12 * time.Second},
		{name: "429 capped", status: 429, header: map[string]string{"Retry-After": "86400"}, wantKind: provider.Retryable, wantCode: "http_429", wantAfter: sms.MaxRetryAfter},
		{name: "429 without header", status: 429, wantKind: provider.Retryable, wantCode: "http_429"},
		{name: "500", status: 500, body: "boom", wantKind: provider.Retryable, wantCode: "http_500", wantErrSub: `"boom"`},
		{name: "503 with Retry-After", status: 503, header: map[string]string{"Retry-After": "5"}, wantKind: provider.Retryable, wantCode: "http_503", wantAfter: 5 * time.Second},
		{name: "408", status: 408, wantKind: provider.Retryable, wantCode: "http_408"},
		{name: "404", status: 404, body: `{"error":"no route"}`, wantKind: provider.Permanent, wantCode: "http_404", wantErrSub: `no route`},
		{name: "422 long body is cut", status: 422, body: long, wantKind: provider.Permanent, wantCode: "http_422", wantErrSub: `"...`},
		{name: "300", status: 300, wantKind: provider.Permanent, wantCode: "http_300"},
		// The client asks for gzip (as net/http's does) and reads it decoded.
		{name: "gzip", status: 202, header: map[string]string{"Content-Encoding": "gzip"}, body: gzipped(t, `{"id":"z"}`), wantID: "z"},
		// Longer than the client reads: classified on the status and the start.
		{name: "400 huge body", status: 400, body: huge, wantKind: provider.Permanent, wantCode: "http_400", wantErrSub: `"xxx`},
		{name: "202 huge body", status: 202, body: `{"id":"x` + huge, wantKind: provider.Retryable, wantCode: "bad_response"},
		{name: "10 KiB of headers (a CDN's)", status: 202, header: padding, body: `{"id":"p"}`, wantID: "p"},
	}
	for _, tr := range transports {
		for _, tt := range tests {
			t.Run(tr.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				url := cannedServer(t, func(w http.ResponseWriter, _ *http.Request) {
					for k, v := range tt.header {
						w.Header().Set(k, v)
					}
					w.WriteHeader(tt.status)
					_, _ = io.WriteString(w, tt.body)
				})
				c, err := sms.New(sms.Config{URL: url, HTTPClient: tr.http()})
				require.NoError(t, err)

				id, err := c.Send(t.Context(), message("k"))
				if tt.wantCode == "" {
					require.NoError(t, err)
					require.Equal(t, tt.wantID, id)
					return
				}
				pe := requireSendError(t, err, tt.wantKind, tt.wantCode)
				require.Equal(t, tt.wantAfter, pe.RetryAfter)
				if tt.wantErrSub != "" {
					require.Contains(t, err.Error(), tt.wantErrSub)
				}
				if len(tt.body) > 200 {
					require.NotContains(t, err.Error(), tt.body, "the excerpt must be cut")
					require.Less(t, len(err.Error()), 400)
				}
			})
		}
	}
}

// gzipped is s compressed with gzip.
func gzipped(t *testing.T, s string) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, err := zw.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return b.String()
}

func TestSendTransportErrors(t *testing.T) {
	t.Parallel()

	t.Run("connection refused is network", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		c, err := sms.New(sms.Config{URL: "http://" + addr})
		require.NoError(t, err)
		_, err = c.Send(t.Context(), message("k"))
		requireSendError(t, err, provider.Retryable, "network")
	})

	t.Run("caller deadline is timeout", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fakesms.WithConfig(fakesms.Config{Delay: 5 * time.Second}))
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		_, err := b.client(t, 10*time.Second).Send(ctx, message("k"))
		requireSendError(t, err, provider.Retryable, "timeout")
	})

	t.Run("caller cancel is canceled", func(t *testing.T) {
		t.Parallel()
		b := setup(t, fakesms.WithConfig(fakesms.Config{Delay: 5 * time.Second}))
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(50*time.Millisecond, cancel)
		_, err := b.client(t, 10*time.Second).Send(ctx, message("k"))
		requireSendError(t, err, provider.Retryable, "canceled")
	})
}

func TestSendInvalidMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, time.Second)

	noRecipient := message("k")
	noRecipient.Recipient = ""
	_, err := c.Send(t.Context(), noRecipient)
	requireSendError(t, err, provider.Permanent, "message")

	_, err = c.Send(t.Context(), message(""))
	requireSendError(t, err, provider.Permanent, "message")
	require.Empty(t, b.fake.Attempts())
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     sms.Config
		wantSub string // "" means valid
	}{
		{"http", sms.Config{URL: "http://localhost:9025"}, ""},
		{"https with path", sms.Config{URL: "https://sms.example.com/api"}, ""},
		{"empty URL", sms.Config{}, "Config.URL"},
		{"relative URL", sms.Config{URL: "/v1"}, "Config.URL"},
		{"no host", sms.Config{URL: "http://"}, "Config.URL"},
		{"ftp scheme", sms.Config{URL: "ftp://example.com"}, "Config.URL"},
		{"query", sms.Config{URL: "https://example.com/?a=b"}, "Config.URL"},
		{"user info", sms.Config{URL: "https://u:p@example.com"}, "Config.URL"},
		{"token in the query", sms.Config{URL: "https://example.com/?token=abc"}, "Config.URL"},
		{"negative timeout", sms.Config{URL: "https://example.com", Timeout: -time.Second}, "Config.Timeout"},
		{"token with newline", sms.Config{URL: "https://example.com", Token: "a\nb"}, "Config.Token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := sms.New(tt.cfg)
			if tt.wantSub == "" {
				require.NoError(t, err)
				require.NotNil(t, c)
				return
			}
			require.ErrorIs(t, err, sms.ErrInvalidConfig)
			require.ErrorContains(t, err, tt.wantSub)
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	httpDate := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"   ", 0},
		{"0", 0},
		{"7", 7 * time.Second},
		{" 7 ", 7 * time.Second},
		{"3600", time.Hour},
		{"3601", sms.MaxRetryAfter},
		{"99999999999999999999999", sms.MaxRetryAfter},
		{"-1", 0},
		{"1.5", 0},
		{"soon", 0},
		{httpDate(30 * time.Second), 30 * time.Second},
		{httpDate(-30 * time.Second), 0},
		{httpDate(0), 0},
		{httpDate(48 * time.Hour), sms.MaxRetryAfter},
		{now.Add(90 * time.Second).Format(time.RFC850), 90 * time.Second},
		{now.Add(2 * time.Minute).Format(time.ANSIC), 2 * time.Minute},
		{"Mon, 32 Jan 2030 00:00:00 GMT", 0},
	}
	for _, tt := range tests {
		got := sms.ParseRetryAfter(tt.in, now)
		require.Equal(t, tt.want, got, "ParseRetryAfter(%q) = %v, want %v", tt.in, got, tt.want)
	}
}

func TestDefaultTemplates(t *testing.T) {
	t.Parallel()
	tmpl := sms.DefaultTemplates()
	require.Equal(t, []string{"certificate-cleanup", "course-expiry", "subscription-renewal"}, tmpl.Names())

	deadline := time.Date(2030, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		data map[string]any
		want string
	}{
		{"course-expiry", map[string]any{"learner": "Ada", "course": "Go 101", "deadline": deadline},
			"Hi Ada, your access to Go 101 expires on 1 Mar 2030. Finish your lessons before then to keep your progress."},
		{"course-expiry", nil,
			"Hi there, your access to your course expires soon. Finish your lessons before then to keep your progress."},
		{"course-expiry", map[string]any{"deadline": time.Time{}},
			"Hi there, your access to your course expires soon. Finish your lessons before then to keep your progress."},
		{"subscription-renewal", map[string]any{"customer": "Bo", "plan": "Pro", "deadline": &deadline},
			"Hi Bo, your Pro renews on 1 Mar 2030. To change or cancel it, do so before then."},
		{"subscription-renewal", map[string]any{"deadline": "2030-03-01T12:00:00Z"},
			"Hi there, your subscription renews on 1 Mar 2030. To change or cancel it, do so before then."},
		{"certificate-cleanup", map[string]any{"owner": "Cy", "certificate": "CERT-9", "host": "api.example.com", "deadline": deadline},
			"Hi Cy, the certificate CERT-9 on api.example.com expires on 1 Mar 2030. Renew it, or remove it if it is no longer used."},
		{"certificate-cleanup", map[string]any{"unrelated": 1, "deadline": "not a date"},
			"Hi there, the certificate you manage expires soon. Renew it, or remove it if it is no longer used."},
	}
	for _, tt := range tests {
		got, err := tmpl.Render(tt.name, tt.data)
		require.NoError(t, err)
		require.Equal(t, tt.want, got)
		require.NotContains(t, got, "<no value>")
	}
}

func TestSendAddsReminderFacts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "facts.sms.tmpl"),
		[]byte(`{{.reminder_id}} {{.tenant}} {{date .deadline "2006-01-02"}} {{.extra}}`), 0o600))
	tmpl, err := sms.LoadTemplates(dir)
	require.NoError(t, err)
	b := setup(t)
	c, err := sms.New(sms.Config{URL: b.url, HTTPClient: b.httpClient(), Templates: tmpl})
	require.NoError(t, err)

	msg := message("k")
	msg.Template = "facts"
	msg.Data["extra"] = "x"
	_, err = c.Send(t.Context(), msg)
	require.NoError(t, err)
	require.Equal(t, "42 acme 2030-01-31 x", b.fake.Messages()[0].Body)
}

// TestSendRendersEachMessageFromItsOwnData: renders reuse their data map and
// buffer from one send to the next; nothing of an earlier message's data or
// text may reach a later one, also when sends run at once.
func TestSendRendersEachMessageFromItsOwnData(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, 0)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			msg := message(fmt.Sprintf("k%d", i))
			msg.ReminderID = int64(i)
			msg.Data = map[string]any{}
			if i%2 == 0 {
				msg.Data = map[string]any{"learner": fmt.Sprintf("Learner %d", i), "course": "Course " + strings.Repeat("x", i*40)}
			}
			_, err := c.Send(t.Context(), msg)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	msgs := b.fake.Messages()
	require.Len(t, msgs, 40)
	for _, m := range msgs {
		i, err := strconv.Atoi(m.Reference)
		require.NoError(t, err)
		want := "Hi there, your access to your course expires on 31 Jan 2030. Finish your lessons before then to keep your progress."
		if i%2 == 0 {
			want = fmt.Sprintf("Hi Learner %d, your access to Course %s expires on 31 Jan 2030. Finish your lessons before then to keep your progress.",
				i, strings.Repeat("x", i*40))
		}
		require.Equal(t, want, m.Body, "reminder %d", i)
	}
}

func TestLoadTemplates(t *testing.T) {
	t.Parallel()
	write := func(t *testing.T, dir, name, content string) {
		t.Helper()
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600))
	}

	t.Run("empty dir means defaults", func(t *testing.T) {
		t.Parallel()
		tmpl, err := sms.LoadTemplates("")
		require.NoError(t, err)
		require.Equal(t, sms.DefaultTemplates().Names(), tmpl.Names())
	})

	t.Run("files override and extend", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		write(t, dir, "course-expiry.sms.tmpl", "{{.course}} ends {{index . \"expires-at\"}}\n")
		write(t, dir, "welcome.sms.tmpl", "Welcome {{or .name \"friend\"}}")
		write(t, dir, "notes.txt", "ignored")
		tmpl, err := sms.LoadTemplates(dir)
		require.NoError(t, err)
		require.Equal(t, []string{"certificate-cleanup", "course-expiry", "subscription-renewal", "welcome"}, tmpl.Names())

		got, err := tmpl.Render("course-expiry", map[string]any{"course": "Go", "expires-at": "today"})
		require.NoError(t, err)
		require.Equal(t, "Go ends today", got)
		got, err = tmpl.Render("welcome", nil)
		require.NoError(t, err)
		require.Equal(t, "Welcome friend", got)
	})

	t.Run("errors", func(t *testing.T) {
		t.Parallel()
		_, err := sms.LoadTemplates(filepath.Join(t.TempDir(), "missing"))
		require.Error(t, err)

		_, err = sms.LoadTemplates(t.TempDir())
		require.ErrorContains(t, err, "no *.sms.tmpl files")

		bad := t.TempDir()
		write(t, bad, "broken.sms.tmpl", "{{.oops")
		_, err = sms.LoadTemplates(bad)
		require.ErrorContains(t, err, "broken.sms.tmpl")
	})
}

func TestRenderErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "blank.sms.tmpl"), []byte("{{if .x}}x{{end}}  \n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fails.sms.tmpl"), []byte(`{{index .list 5}}`), 0o600))
	tmpl, err := sms.LoadTemplates(dir)
	require.NoError(t, err)

	_, err = tmpl.Render("nope", nil)
	require.ErrorIs(t, err, sms.ErrUnknownTemplate)
	_, err = tmpl.Render("blank", nil)
	require.ErrorIs(t, err, sms.ErrEmptyBody)
	_, err = tmpl.Render("fails", map[string]any{"list": []int{1}})
	require.ErrorContains(t, err, "index out of range")

	c, err := sms.New(sms.Config{URL: "http://127.0.0.1:1", Templates: tmpl})
	require.NoError(t, err)
	msg := message("k")
	msg.Template = "blank"
	_, err = c.Send(t.Context(), msg)
	requireSendError(t, err, provider.Permanent, "template")
}

// TestNewNeverQuotesCredentials is the regression test for issue 13, finding
// 4: the SMS URL's user info was quoted whole in the error.
func TestNewNeverQuotesCredentials(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		"https://user:Qj/Kx@sms.example.com", "https://user:Qj@Kx@sms.example.com", "https://user:Qj:Kx@sms.example.com",
		"https://user:Qj%Kx@sms.example.com", "https://user:Qj?Kx@sms.example.com", "https://user:Qj#Kx@sms.example.com",
		"https://user:Qj@sms.example.com", "https://sms.example.com/?token=QjKx",
	} {
		_, err := sms.New(sms.Config{URL: raw})
		require.ErrorIs(t, err, sms.ErrInvalidConfig, raw)
		require.NotContains(t, err.Error(), "Qj", raw)
		require.NotContains(t, err.Error(), "Kx", raw)
	}
}
