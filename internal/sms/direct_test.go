package sms_test

import (
	"bufio"
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
)

// The generic client's two transports: the default (the direct client) and
// net/http's, which New keeps for a proxy or a caller's HTTPClient.
var transports = []struct {
	name string
	http func() *http.Client
}{
	{"direct", func() *http.Client { return nil }},
	{"net/http", func() *http.Client { return &http.Client{Transport: &http.Transport{}} }},
}

// rawServer accepts connections on loopback and runs serve on each, on a
// goroutine of its own; it returns the address. Everything is closed when
// the test ends.
func rawServer(t *testing.T, serve func(conn net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { defer c.Close(); serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// readRequest reads one request from br, body included, and returns the
// bytes it came in (the client sends one request and waits: what br has
// read is exactly that request).
func readRequest(br *bufio.Reader, raw *bytes.Buffer) (*http.Request, []byte, error) {
	raw.Reset()
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	if _, err := io.Copy(io.Discard, req.Body); err != nil {
		return nil, nil, err
	}
	return req, bytes.Clone(raw.Bytes()), nil
}

// wireServer is a rawServer that sends each request it reads, as it came on
// the wire, on the channel it returns, and writes the answer answer gives.
func wireServer(t *testing.T, answer func(*http.Request) string) (string, <-chan []byte) {
	t.Helper()
	got := make(chan []byte, 8)
	addr := rawServer(t, func(conn net.Conn) {
		var raw bytes.Buffer
		br := bufio.NewReader(io.TeeReader(conn, &raw))
		for {
			req, b, err := readRequest(br, &raw)
			if err != nil {
				return
			}
			got <- b
			if _, err := io.WriteString(conn, answer(req)); err != nil {
				return
			}
		}
	})
	return addr, got
}

const acceptedAnswer = "HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"id\":\"prov-1\"}"

// senders are the adapters with a send over HTTP, each built for url with
// a timeout and Config.HTTPClient (nil: the direct client).
var senders = []struct {
	name string
	new  func(t *testing.T, url string, timeout time.Duration, hc *http.Client) provider.Sender
}{
	{"generic", func(t *testing.T, url string, timeout time.Duration, hc *http.Client) provider.Sender {
		c, err := sms.New(sms.Config{URL: url, Timeout: timeout, HTTPClient: hc})
		require.NoError(t, err)
		return c
	}},
	{"twilio", func(t *testing.T, url string, timeout time.Duration, hc *http.Client) provider.Sender {
		c, err := sms.NewTwilio(sms.TwilioConfig{URL: url, AccountSID: testAccount, AuthToken: testToken, From: "+15005550006",
			Timeout: timeout, HTTPClient: hc})
		require.NoError(t, err)
		return c
	}},
}

// TestDirectWireMatchesNetHTTP: the bytes a provider receives from the
// direct client, for a send and a lookup, are the bytes net/http's client
// writes for the same calls, in the same order (TestSendWireFormat compares
// the parsed request with a golden; this compares the wire itself).
func TestDirectWireMatchesNetHTTP(t *testing.T) {
	t.Parallel()
	addr, got := wireServer(t, func(req *http.Request) string {
		if req.Method == http.MethodGet {
			return "HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"id\":\"prov-1\"}"
		}
		return acceptedAnswer
	})
	wires := map[string][2][]byte{}
	for _, tr := range transports {
		for _, token := range []string{"tok", ""} {
			c, err := sms.New(sms.Config{URL: "http://" + addr + "/gateway/", Token: token, Sender: "NUDGE", HTTPClient: tr.http()})
			require.NoError(t, err)
			require.Equal(t, tr.name == "direct", sms.Direct(c))
			m := wireMessage()
			m.IdempotencyKey = "rem-42-v3 with/slash"
			id, err := c.Send(t.Context(), m)
			require.NoError(t, err)
			require.Equal(t, "prov-1", id)
			send := <-got
			id, err = c.Lookup(t.Context(), m)
			require.NoError(t, err)
			require.Equal(t, "prov-1", id)
			wires[tr.name+" "+token] = [2][]byte{send, <-got}
		}
	}
	for _, token := range []string{"tok", ""} {
		want, have := wires["net/http "+token], wires["direct "+token]
		require.Equal(t, string(want[0]), string(have[0]), "send, token %q", token)
		require.Equal(t, string(want[1]), string(have[1]), "lookup, token %q", token)
	}
	require.Contains(t, string(wires["direct tok"][0]), "POST /gateway/v1/messages HTTP/1.1\r\nHost: "+addr+"\r\nUser-Agent: Go-http-client/1.1\r\n")
}

// TestTwilioDirectWireMatchesNetHTTP is TestDirectWireMatchesNetHTTP for
// Twilio's adapter: a create, a lookup by SID and a lookup by listing
// reach Twilio as the same bytes through either transport.
func TestTwilioDirectWireMatchesNetHTTP(t *testing.T) {
	t.Parallel()
	addr, got := wireServer(t, func(req *http.Request) string {
		body, status := `{"sid":"SM1","status":"queued"}`, "201 Created"
		switch {
		case req.Method != http.MethodGet:
		case strings.HasSuffix(req.URL.Path, "/Messages.json"):
			body, status = `{"messages":[],"next_page_uri":null}`, "200 OK"
		default:
			status = "200 OK"
		}
		return fmt.Sprintf("HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", status, len(body), body)
	})
	wires := map[string][3][]byte{}
	for _, tr := range transports {
		c, err := sms.NewTwilio(sms.TwilioConfig{URL: "http://" + addr + "/twilio/", AccountSID: testAccount, AuthToken: testToken,
			From: "+15005550006", StatusCallback: "https://hooks.example.com/twilio?x=1", HTTPClient: tr.http()})
		require.NoError(t, err)
		require.Equal(t, tr.name == "direct", sms.TwilioDirect(c))
		m := wireMessage()
		id, err := c.Send(t.Context(), m)
		require.NoError(t, err)
		require.Equal(t, "SM1", id)
		send := <-got
		m.Earlier = []provider.Earlier{{ProviderID: "SM1", Started: time.Now()}}
		id, err = c.Lookup(t.Context(), m)
		require.NoError(t, err)
		require.Equal(t, "SM1", id)
		bySID := <-got
		_, err = c.Lookup(t.Context(), earlier(m))
		require.ErrorIs(t, err, provider.ErrNotFound)
		wires[tr.name] = [3][]byte{send, bySID, <-got}
	}
	want, have := wires["net/http"], wires["direct"]
	for i, what := range []string{"create", "lookup by SID", "lookup by listing"} {
		require.Equal(t, string(want[i]), string(have[i]), what)
	}
	require.Contains(t, string(have[0]), "POST /twilio/2010-04-01/Accounts/"+testAccount+"/Messages.json HTTP/1.1\r\nHost: "+addr+"\r\n")
	require.Contains(t, string(have[2]), "GET /twilio/2010-04-01/Accounts/"+testAccount+"/Messages.json?From=")
}

// TestDirectNeverSendsAPostTwice: a connection that fails after the request
// was written (the provider read it, then closed without answering) ends
// the send with an unknown outcome; the client does not send it again on
// another connection, fresh or pooled (a provider without deduplication
// would deliver it twice: Twilio does).
func TestDirectNeverSendsAPostTwice(t *testing.T) {
	t.Parallel()
	const body = `{"id":"prov-1","sid":"SM1"}` // an acceptance to either adapter
	accepted := fmt.Sprintf("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	for _, s := range senders {
		for _, tc := range []struct {
			name   string
			answer int // requests answered before the one read and dropped
		}{{"on a new connection", 0}, {"on a pooled connection", 1}} {
			t.Run(s.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				var requests atomic.Int64
				addr := rawServer(t, func(conn net.Conn) {
					var raw bytes.Buffer
					br := bufio.NewReader(io.TeeReader(conn, &raw))
					for i := 0; ; i++ {
						if _, _, err := readRequest(br, &raw); err != nil {
							return
						}
						requests.Add(1)
						if i >= tc.answer {
							return // read, then closed without an answer
						}
						if _, err := io.WriteString(conn, accepted); err != nil {
							return
						}
					}
				})
				c := s.new(t, "http://"+addr, 5*time.Second, nil)
				for range tc.answer {
					_, err := c.Send(t.Context(), message("k"))
					require.NoError(t, err)
				}
				_, err := c.Send(t.Context(), message("k"))
				pe := requireSendError(t, err, provider.Retryable, "network")
				require.Equal(t, "unknown", string(pe.Outcome()))
				require.Equal(t, int64(tc.answer+1), requests.Load(), "the dropped request was sent once")
			})
		}
	}
}

// TestDirectSkipsAConnectionClosedWhileIdle: a pooled connection the
// provider closed while it was idle (its idle timeout, a restart) is not
// written to: the next send goes out once, on a new connection, and
// succeeds.
func TestDirectSkipsAConnectionClosedWhileIdle(t *testing.T) {
	t.Parallel()
	var requests, conns atomic.Int64
	closed := make(chan struct{}, 1)
	addr := rawServer(t, func(conn net.Conn) {
		conns.Add(1)
		var raw bytes.Buffer
		br := bufio.NewReader(io.TeeReader(conn, &raw))
		if _, _, err := readRequest(br, &raw); err != nil {
			return
		}
		requests.Add(1)
		_, _ = io.WriteString(conn, acceptedAnswer)
		_ = conn.Close() // idle, then closed: no Connection: close said
		closed <- struct{}{}
	})
	c, err := sms.New(sms.Config{URL: "http://" + addr, Timeout: 5 * time.Second})
	require.NoError(t, err)
	_, err = c.Send(t.Context(), message("k1"))
	require.NoError(t, err)
	<-closed // over loopback, the FIN is in the client's socket once close returns
	_, err = c.Send(t.Context(), message("k2"))
	require.NoError(t, err)
	require.Equal(t, int64(2), requests.Load())
	require.Equal(t, int64(2), conns.Load())
}

// TestDirectTLS: an https provider is reached over TLS and verified: with
// its CA trusted the send and the lookup go through; without it, nothing is
// sent and the error names the certificate.
func TestDirectTLS(t *testing.T) {
	t.Parallel()
	fake := fakesms.New()
	ts := httptest.NewTLSServer(fake)
	t.Cleanup(ts.Close)
	t.Cleanup(fake.Close)
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())

	c, err := sms.New(sms.Config{URL: ts.URL, Timeout: 5 * time.Second})
	require.NoError(t, err)
	require.True(t, sms.Direct(c))
	sms.TrustOnly(c, roots)
	id, err := c.Send(t.Context(), message("k-tls"))
	require.NoError(t, err)
	found, err := c.Lookup(t.Context(), message("k-tls"))
	require.NoError(t, err)
	require.Equal(t, id, found)

	other, err := sms.New(sms.Config{URL: ts.URL, Timeout: 5 * time.Second})
	require.NoError(t, err)
	sms.TrustOnly(other, x509.NewCertPool())
	_, err = other.Send(t.Context(), message("k-untrusted"))
	requireSendError(t, err, provider.Retryable, "network")
	var unknown x509.UnknownAuthorityError
	require.True(t, errors.As(err, &unknown), "%v", err)
	require.Len(t, fake.Messages(), 1)
}

// TestTwilioDirectTLS: Twilio's adapter reaches an https API over TLS with
// the direct client, verified: a create, a lookup by SID and one by listing.
func TestTwilioDirectTLS(t *testing.T) {
	t.Parallel()
	fake := fakesms.New(fakesms.WithTwilioAccount(testAccount, testToken))
	ts := httptest.NewTLSServer(fake)
	t.Cleanup(ts.Close)
	t.Cleanup(fake.Close)
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())

	c, err := sms.NewTwilio(sms.TwilioConfig{URL: ts.URL, AccountSID: testAccount, AuthToken: testToken, From: "+15005550006",
		Timeout: 5 * time.Second})
	require.NoError(t, err)
	require.True(t, sms.TwilioDirect(c))
	sms.TwilioTrustOnly(c, roots)
	sid, err := c.Send(t.Context(), message("k-tls"))
	require.NoError(t, err)
	m := message("k-tls")
	m.Earlier = []provider.Earlier{{ProviderID: sid, Started: time.Now()}}
	found, err := c.Lookup(t.Context(), m)
	require.NoError(t, err)
	require.Equal(t, sid, found)
	found, err = c.Lookup(t.Context(), earlier(message("k-tls")))
	require.NoError(t, err)
	require.Equal(t, sid, found)
	require.Len(t, fake.Messages(), 1)
}

// TestDefaultClientHonoursProxy: when the environment names a proxy for the
// provider's URL, New keeps net/http's client, which sends through it; when
// NO_PROXY exempts the host, the direct client is used. Run in a child
// process: net/http reads the proxy variables once per process.
func TestDefaultClientHonoursProxy(t *testing.T) {
	if url := os.Getenv("NUDGE_SMS_PROXY_CHILD"); url != "" {
		c, err := sms.New(sms.Config{URL: url, Timeout: 5 * time.Second})
		require.NoError(t, err)
		tw, err := sms.NewTwilio(sms.TwilioConfig{URL: url, AccountSID: testAccount, AuthToken: testToken, From: "+15005550006"})
		require.NoError(t, err)
		if os.Getenv("NO_PROXY") != "" {
			require.True(t, sms.Direct(c))
			require.True(t, sms.TwilioDirect(tw))
			return
		}
		require.False(t, sms.Direct(c))
		require.False(t, sms.TwilioDirect(tw))
		id, err := c.Send(t.Context(), message("k-proxy"))
		require.NoError(t, err)
		require.Equal(t, "via-proxy", id)
		return
	}
	t.Parallel()
	got := make(chan string, 1)
	proxy := serve(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- r.Method + " " + r.URL.String()
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"id":"via-proxy"}`)
	})
	for _, noProxy := range []string{"", "sms.example.invalid"} {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run", "^TestDefaultClientHonoursProxy$", "-test.count", "1")
		cmd.Env = append(os.Environ(), "NUDGE_SMS_PROXY_CHILD=http://sms.example.invalid/api", "HTTP_PROXY="+proxy, "NO_PROXY="+noProxy)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		if noProxy == "" {
			require.Equal(t, "POST http://sms.example.invalid/api/v1/messages", <-got)
		}
	}
	require.Empty(t, got)
}

// TestDirectOrNetHTTP: New and NewTwilio use the direct client unless the
// caller gives an HTTPClient or the host is not ASCII (net/http sends its
// IDNA form).
func TestDirectOrNetHTTP(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg    sms.Config
		direct bool
	}{
		{sms.Config{URL: "http://127.0.0.1:9025"}, true},
		{sms.Config{URL: "https://sms.example.com/api"}, true},
		{sms.Config{URL: "https://sms.example.com", HTTPClient: &http.Client{}}, false},
		{sms.Config{URL: "https://bücher.example"}, false},
	} {
		c, err := sms.New(tc.cfg)
		require.NoError(t, err)
		require.Equal(t, tc.direct, sms.Direct(c), tc.cfg.URL)
		tw, err := sms.NewTwilio(sms.TwilioConfig{URL: tc.cfg.URL, AccountSID: testAccount, AuthToken: testToken, From: "+15005550006",
			HTTPClient: tc.cfg.HTTPClient})
		require.NoError(t, err)
		require.Equal(t, tc.direct, sms.TwilioDirect(tw), "twilio at "+tc.cfg.URL)
	}
}

// An idempotency key that is not a valid header value (a line break) is
// refused as net/http refuses it, and nothing reaches the provider.
func TestSendRefusesAnInvalidKey(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		b := setup(t)
		c, err := sms.New(sms.Config{URL: b.url, HTTPClient: tr.http()})
		require.NoError(t, err)
		_, err = c.Send(t.Context(), message("k\r\nX-Injected: 1"))
		requireSendError(t, err, provider.Retryable, "network")
		require.ErrorContains(t, err, `invalid header field value for "Idempotency-Key"`, tr.name)
		require.Empty(t, b.fake.Attempts(), tr.name)
	}
}
