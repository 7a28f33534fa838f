package sms_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/provider"
)

// stallPoints are servers that stall a send where it can stall: in the TLS
// handshake, before the status line, in the middle of the body.
func stallPoints(t *testing.T) []struct {
	name string
	url  func(t *testing.T) string
} {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	stall := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}
	halfBody := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id": "sms_`))
		w.(http.Flusher).Flush()
		stall(w, r)
	}
	return []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"in the TLS handshake", func(t *testing.T) string { return "https://" + silentListener(t) }},
		{"before the status line", func(t *testing.T) string { return serve(t, stall) }},
		{"in the body", func(t *testing.T) string { return serve(t, halfBody) }},
	}
}

// The caller's deadline, not Config.Timeout, ends a send wherever the
// exchange stalls, through either adapter and either transport, and so does
// a cancellation (the worker's abort at the end of its grace period). The
// worker sets that deadline to the reminder's.
func TestSendIsCutAtTheCallersDeadline(t *testing.T) {
	t.Parallel()
	endings := []struct {
		name    string
		code    string
		want    error
		context func(context.Context) (context.Context, context.CancelFunc)
	}{
		{"deadline", "timeout", context.DeadlineExceeded, func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 300*time.Millisecond)
		}},
		{"cancellation", "canceled", context.Canceled, func(ctx context.Context) (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(ctx)
			stop := time.AfterFunc(300*time.Millisecond, cancel)
			return ctx, func() { stop.Stop(); cancel() }
		}},
	}
	for _, s := range senders {
		for _, tr := range transports {
			for _, end := range endings {
				for _, tc := range stallPoints(t) {
					t.Run(s.name+"/"+tr.name+"/"+end.name+"/"+tc.name, func(t *testing.T) {
						t.Parallel()
						c := s.new(t, tc.url(t), 20*time.Second, tr.http())
						// The clock starts before the deadline is set: a send that
						// ends at its deadline took at least 300 ms from here.
						start := time.Now()
						ctx, cancel := end.context(t.Context())
						defer cancel()
						_, err := c.Send(ctx, message("k"))
						took := time.Since(start)
						requireSendError(t, err, provider.Retryable, end.code)
						require.ErrorIs(t, err, end.want)
						require.GreaterOrEqual(t, took, 300*time.Millisecond, "not before the "+end.name)
						require.Less(t, took, 5*time.Second, "at the "+end.name+", not at Config.Timeout")
					})
				}
			}
		}
	}
}

// serve runs h over plain HTTP and returns its URL.
func serve(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL
}

// silentListener accepts connections and never writes to them; it returns
// its address.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// The gate (provider.Message.Gate) is the caller's last word: it runs once
// per send, after the message is rendered, and when it refuses nothing
// reaches the provider.
func TestGateRefusalSendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.client(t, 5*time.Second)

	calls := 0
	m := message("k")
	m.Gate = func() error { calls++; return errors.New("deadline within the margin") }
	_, err := c.Send(t.Context(), m)
	pe := requireSendError(t, err, provider.Retryable, provider.CodeNotStarted)
	require.Equal(t, "not_sent", string(pe.Outcome()))
	require.ErrorContains(t, err, "deadline within the margin")
	require.Equal(t, 1, calls)
	require.Empty(t, b.fake.Attempts(), "nothing reached the provider")

	m.Gate = func() error { calls++; return nil }
	id, err := c.Send(t.Context(), m)
	require.NoError(t, err)
	require.NotEmpty(t, id)
	require.Equal(t, 2, calls)
	require.Len(t, b.fake.Attempts(), 1)

	m = message("no template")
	m.Template = "missing"
	m.Gate = func() error { calls++; return nil }
	_, err = c.Send(t.Context(), m)
	requireSendError(t, err, provider.Permanent, "template")
	require.Equal(t, 2, calls, "a message that cannot be rendered never reaches the gate")
}
