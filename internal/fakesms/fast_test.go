package fakesms_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fakesms"
)

// startFast serves fake with a FastServer on a loopback port and returns its
// address.
func startFast(t *testing.T, fake *fakesms.Server) (string, *fakesms.FastServer) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := fakesms.NewFastServer(fake)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		fake.Close()
		require.NoError(t, srv.Close())
		require.ErrorIs(t, <-done, http.ErrServerClosed)
	})
	return ln.Addr().String(), srv
}

// rawConn is one keep-alive connection that sends raw requests and returns
// raw answers.
type rawConn struct {
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{c: c, br: bufio.NewReader(c)}
}

var dateLine = regexp.MustCompile(`(?m)^Date: [^\r]*\r$`)

// exchange writes req and returns the answer's bytes, its Date value masked.
func (rc *rawConn) exchange(t *testing.T, req string) string {
	t.Helper()
	_, err := io.WriteString(rc.c, req)
	require.NoError(t, err)
	var raw bytes.Buffer
	resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(rc.br, &raw)), nil)
	require.NoError(t, err)
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return dateLine.ReplaceAllString(raw.String(), "Date: (masked)\r")
}

// sendReq is a raw generic send as the SMS client writes it.
func sendReq(key, body string, extra ...string) string {
	var b strings.Builder
	b.WriteString("POST /v1/messages HTTP/1.1\r\nHost: sms.test\r\nUser-Agent: nudge\r\n")
	fmt.Fprintf(&b, "Content-Length: %d\r\nContent-Type: application/json\r\n", len(body))
	if key != "" {
		fmt.Fprintf(&b, "Idempotency-Key: %s\r\n", key)
	}
	for _, h := range extra {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("Accept-Encoding: gzip\r\n\r\n")
	return b.String() + body
}

// The FastServer answers every send, byte for byte, as the Server does
// through net/http's server, and keeps the same records: accepts,
// duplicates, refusals, injected statuses with Retry-After, and requests
// it hands to net/http (other routes, odd heads) on the same connection.
func TestFastServerWire(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	opts := []fakesms.Option{fakesms.WithClock(clock.NewFake(at)), fakesms.WithToken("tok"),
		fakesms.WithConfig(fakesms.Config{RetryAfterSeconds: 7})}
	ref := fakesms.New(opts...)
	ts := httptest.NewServer(ref)
	t.Cleanup(ts.Close)
	fast := fakesms.New(opts...)
	addr, srv := startFast(t, fast)
	want, got := dialRaw(t, ts.Listener.Addr().String()), dialRaw(t, addr)

	auth := "Authorization: Bearer tok"
	ok := `{"to":"+14150000001","body":"Your course expires","reference":"42","tenant":"acme"}`
	steps := []struct {
		name    string
		enqueue []fakesms.Outcome
		req     string
	}{
		{"accept", nil, sendReq("k1", ok, auth)},
		{"duplicate", nil, sendReq("k1", ok, auth)},
		{"spaced JSON, escapes", nil, sendReq("k2", "{ \"to\" : \"+1415\",\n\"body\":\"a \\u00e9 \\\"b\\\"\" , \"x\":[1]}", auth)},
		{"wrong token", nil, sendReq("k3", ok, "Authorization: Bearer nope")},
		{"no key", nil, sendReq("", ok, auth)},
		{"invalid JSON", nil, sendReq("k4", `{"to":`, auth)},
		{"wrong type", nil, sendReq("k5", `{"to":1,"body":"b"}`, auth)},
		{"missing body", nil, sendReq("k6", `{"to":"+1415"}`, auth)},
		{"429 with Retry-After", []fakesms.Outcome{"429"}, sendReq("k7", ok, auth)},
		{"503", []fakesms.Outcome{"503"}, sendReq("k8", ok, auth)},
		{"400", []fakesms.Outcome{"400"}, sendReq("k9", ok, auth)},
		{"unnamed status", []fakesms.Outcome{"461"}, sendReq("k10", ok, auth)},
		{"accept after faults", nil, sendReq("k7", ok, auth)},
		{"lower-case header names", nil, strings.Replace(sendReq("k11", ok, auth), "Idempotency-Key", "idempotency-key", 1)},
		{"a lookup, handed to net/http", nil, "GET /v1/messages/k1 HTTP/1.1\r\nHost: sms.test\r\n" + auth + "\r\n\r\n"},
		{"a send after the hand-off", nil, sendReq("k12", ok, auth)},
	}
	for _, st := range steps {
		require.NoError(t, ref.Enqueue(st.enqueue...))
		require.NoError(t, fast.Enqueue(st.enqueue...))
		w, g := want.exchange(t, st.req), got.exchange(t, st.req)
		require.Equal(t, w, g, st.name)
	}
	require.Equal(t, ref.Attempts(), fast.Attempts())
	require.Equal(t, ref.Messages(), fast.Messages())
	require.Equal(t, ref.Stats(), fast.Stats())
	require.EqualValues(t, 1, srv.Accepted())
	require.EqualValues(t, len(steps)-2, fakesms.ShortPathServed(srv), "every send but the one after the hand-off")

	// A connection that starts with another route, or with a send whose head
	// the short path does not take, is net/http's from its first request.
	for _, req := range []string{
		"GET /stats HTTP/1.1\r\nHost: sms.test\r\n\r\n",
		sendReq("k20", ok, auth, "Connection: close"),
		strings.Replace(sendReq("k21", ok, auth), "Host: sms.test", "Host: a b", 1),
	} {
		w, g := dialRaw(t, ts.Listener.Addr().String()).exchange(t, req), dialRaw(t, addr).exchange(t, req)
		require.Equal(t, w, g)
	}
	require.EqualValues(t, 4, srv.Accepted())
}

// While the Config can delay or stall, sends go to net/http, which sees a
// client go away during a stall.
func TestFastServerStallsThroughNetHTTP(t *testing.T) {
	t.Parallel()
	fake := fakesms.New()
	addr, _ := startFast(t, fake)
	require.NoError(t, fake.Enqueue(fakesms.TimeoutAfterAccept))
	rc := dialRaw(t, addr)
	_, err := io.WriteString(rc.c, sendReq("k1", `{"to":"+1415","body":"b"}`))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return fake.Stats().Accepted == 1 }, 5*time.Second, 5*time.Millisecond)
	require.NoError(t, rc.c.Close())
	require.Eventually(t, func() bool { return fake.Stats().ClientGone == 1 }, 5*time.Second, 5*time.Millisecond)

	require.NoError(t, fake.SetConfig(fakesms.Config{Delay: 30 * time.Millisecond}))
	start := time.Now()
	resp := dialRaw(t, addr).exchange(t, sendReq("k2", `{"to":"+1415","body":"b"}`))
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond)
	require.Contains(t, resp, "HTTP/1.1 201 Created\r\n")
}

// The accepted answer, appended by hand, is what json.Marshal writes for
// the map it replaced.
func TestAcceptedAnswerAsMarshal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, dup := range []bool{false, true} {
		r := b.send(t, "key-1", "+14150000001", "hello")
		want := map[string]any{"id": r.body["id"], "status": "accepted"}
		if dup {
			want["duplicate"] = true
		}
		raw, err := json.Marshal(want)
		require.NoError(t, err)
		require.Equal(t, string(raw)+"\n", r.raw)
	}
}

// Close ends connections in both paths and Serve returns ErrServerClosed.
func TestFastServerClose(t *testing.T) {
	t.Parallel()
	fake := fakesms.New()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := fakesms.NewFastServer(fake)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	short, handed := dialRaw(t, ln.Addr().String()), dialRaw(t, ln.Addr().String())
	short.exchange(t, sendReq("k1", `{"to":"+1415","body":"b"}`))
	handed.exchange(t, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, srv.Close())
	require.ErrorIs(t, <-done, http.ErrServerClosed)
	for _, rc := range []*rawConn{short, handed} {
		_ = rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := rc.br.ReadByte()
		require.True(t, errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(fmt.Sprint(err), "reset"), "%v", err)
	}
}
