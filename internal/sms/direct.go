package sms

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/nudgehq/nudge/internal/provider"
)

// This file is the default transport of both adapters' clients (Client and
// TwilioClient; each writes its own requests' heads with the helpers at the
// end): each exchange runs on the sending goroutine, from the pooled connection to
// the parsed answer. Why not net/http's client: its transport hands every
// request to two goroutines of the connection (a write loop and a read loop)
// through channels and select, and builds a header map for every answer;
// in the worker's Pipeline benchmark that was ~43% of Nudge's own Go CPU per
// delivered reminder (docs/benchmarks.md). What is used of fasthttp is its
// connection pool (HostClient: LIFO, idle connections closed after
// directIdle) and its response parser; the request is written here, byte for
// byte what net/http writes for the same send (TestDirectWireMatchesNetHTTP),
// so providers see no difference.
//
// What net/http did that is kept:
//
//   - the context bounds everything: the dial and the TLS handshake are made
//     with it (a pooled connection is dialed lazily, by the exchange that
//     first takes it), the connection's deadline is the context's, and a
//     cancellation sets a deadline in the past, which ends a blocked read or
//     write at once;
//   - TLS for https URLs, with the system's roots (SSL_CERT_FILE and
//     SSL_CERT_DIR apply as before), HTTP/1.1 only;
//   - Accept-Encoding: gzip, and gzip answers decoded;
//   - at most maxResponseBody bytes of an answer are kept (drained up to as
//     much again, as readBodyInto does);
//   - a pooled connection the provider closed while it was idle is not
//     written to (its peeker looks before it is used).
//
// What is not: a request is never sent twice by the client on its own (a
// POST on a connection that fails is the caller's to retry, with the same
// idempotency key; Twilio's is looked up first), nor over HTTP/2, nor
// through a proxy: New and NewTwilio keep net/http's client when the
// environment names a proxy for the URL, and when HTTPClient is set.

const (
	// directIdle closes a pooled connection idle for this long: below the
	// idle timeouts providers' servers commonly apply (60 s and more), so
	// the client closes first.
	directIdle = 30 * time.Second
	// directHeaderMax bounds an answer's status line and headers. A
	// provider's are a few hundred bytes; a CDN in front may add a few KiB.
	directHeaderMax = 16 << 10
	// userAgent is what net/http's client sends.
	userAgent = "Go-http-client/1.1"
)

// errInvalidKey is net/http's refusal of a header value with a line break
// or another control byte.
var errInvalidKey = errors.New(`net/http: invalid header field value for "Idempotency-Key"`)

// transport is how a Client or a TwilioClient reaches its provider: the
// direct client, or net/http's client when the caller gave one or the
// direct client cannot serve the URL (newDirect).
type transport struct {
	http   *http.Client  // nil when direct is set
	direct *directClient // the default; nil when net/http's client is used
	// postBefore and postAfter are a direct POST's head around its
	// Content-Length value (postHead), each client's own.
	postBefore, postAfter []byte
}

// newTransport returns the transport to u with the caller's client hc
// (nil: the default).
func newTransport(u *url.URL, hc *http.Client) transport {
	if hc != nil {
		return transport{http: hc}
	}
	if d := newDirect(u); d != nil {
		return transport{direct: d}
	}
	return transport{http: defaultHTTPClient()}
}

// directClient sends a Client's or a TwilioClient's requests to one
// host:port.
type directClient struct {
	pool   *fasthttp.HostClient
	host   string      // the Host header: the URL's host as written
	tls    *tls.Config // nil for http
	dialer net.Dialer
	addr   string // host:port dialed
}

// newDirect returns the direct client for u (http or https, validated by
// New), or nil when u needs what only net/http does: a proxy from the
// environment, or a host name that is not ASCII.
func newDirect(u *url.URL) *directClient {
	if proxied(u) {
		return nil
	}
	for i := range len(u.Host) {
		if u.Host[i] >= 0x80 {
			return nil // net/http sends its IDNA form
		}
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	d := &directClient{host: u.Host, addr: net.JoinHostPort(u.Hostname(), port)}
	if u.Scheme == "https" {
		d.tls = &tls.Config{ServerName: u.Hostname(), NextProtos: []string{"http/1.1"}}
	}
	d.dialer.KeepAlive = 30 * time.Second // as net/http's default transport
	d.pool = &fasthttp.HostClient{
		Addr: d.addr,
		// Dial never blocks: the exchange that takes a new connection
		// connects it with its context (lazyConn.connect).
		Dial:                func(addr string) (net.Conn, error) { return &lazyConn{}, nil },
		MaxConns:            math.MaxInt32, // as net/http's transport: no limit per host
		MaxIdleConnDuration: directIdle,
		ConnPoolStrategy:    fasthttp.LIFO,
		// An answer's status line and headers must fit (net/http allows
		// more); the body is read apart, bounded by maxResponseBody.
		ReadBufferSize: directHeaderMax,
	}
	return d
}

// proxied reports whether the environment's proxy settings (HTTP_PROXY,
// HTTPS_PROXY, NO_PROXY) send requests to u through a proxy, as net/http's
// default transport would.
func proxied(u *url.URL) bool {
	p, err := http.ProxyFromEnvironment(&http.Request{URL: u})
	return err != nil || p != nil
}

// lazyConn is a pooled connection, dialed by the first exchange that takes
// it, with that exchange's context.
type lazyConn struct {
	net.Conn // nil until connected
	// peek looks whether the provider closed the connection while it was
	// idle in the pool (nil: it cannot tell).
	peek *peeker
}

func (c *lazyConn) Close() error {
	if c.Conn == nil {
		return nil
	}
	return c.Conn.Close()
}

// Interrupt ends the connection's blocked read or write at once.
func (c *lazyConn) Interrupt() { _ = c.SetDeadline(past) }

// connect dials d.addr (and shakes hands for https) within ctx.
func (c *lazyConn) connect(ctx context.Context, d *directClient) error {
	conn, err := d.dialer.DialContext(ctx, "tcp", d.addr)
	if err != nil {
		return err
	}
	if d.tls != nil {
		tc := tls.Client(conn, d.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return err
		}
		conn = tc
	}
	c.Conn, c.peek = conn, newPeeker(conn)
	return nil
}

// request is a pooled buffer a request is written into, head and body,
// so that it leaves in one write (TestSendWritesRequestOnce).
type request struct{ b []byte }

var requests = sync.Pool{New: func() any { return &request{b: make([]byte, 0, 1024)} }}

func (r *request) release() {
	if cap(r.b) <= maxPooledRender {
		r.b = r.b[:0]
		requests.Put(r)
	}
}

// past is a deadline that has passed: set on a connection, it ends a
// blocked read or write at once.
var past = time.Unix(1, 0)

// exchange writes req (head and body), reads the answer into a (at most
// maxResponseBody bytes) and returns its status and Retry-After. An answer
// whose body is too long to read whole is given with what was read.
func (d *directClient) exchange(ctx context.Context, req []byte, a *answer) (status int, retryAfter string, err error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultTimeout) // Send and Lookup always set one
	}
	if err := ctx.Err(); err != nil {
		return 0, "", err
	}
	cc, err := d.pool.AcquireConn(0, false)
	if err != nil {
		return 0, "", err
	}
	conn := cc.Conn().(*lazyConn)
	for conn.Conn != nil && conn.peek.closed() {
		// Closed while idle: drop it and take the next (or a new one).
		d.pool.CloseConn(cc)
		if cc, err = d.pool.AcquireConn(0, false); err != nil {
			return 0, "", err
		}
		conn = cc.Conn().(*lazyConn)
	}
	if conn.Conn == nil {
		if err := conn.connect(ctx, d); err != nil {
			d.pool.CloseConn(cc)
			if ctx.Err() != nil {
				return 0, "", fmt.Errorf("%w (%v)", ctx.Err(), err)
			}
			return 0, "", err
		}
	}
	if err := conn.SetDeadline(deadline); err != nil {
		d.pool.CloseConn(cc)
		return 0, "", err
	}
	// The connection's deadline is the context's; only a cancellation
	// needs watching. The worker's send context tells it without arming a
	// timer (provider.CancelWatcher); any other through context.AfterFunc.
	cw, watched := ctx.(provider.CancelWatcher)
	var stop func() bool
	if watched {
		cw.WatchCancel(conn)
	} else {
		stop = context.AfterFunc(ctx, conn.Interrupt)
	}

	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	_, err = conn.Write(req)
	if err == nil {
		br := d.pool.AcquireReader(conn)
		err = resp.ReadLimitBody(br, 2*maxResponseBody)
		d.pool.ReleaseReader(br)
	}
	var canceled bool
	if watched {
		canceled = !cw.StopWatching()
	} else {
		canceled = !stop()
	}
	if err != nil || canceled || resp.ConnectionClose() {
		d.pool.CloseConn(cc)
	} else {
		d.pool.ReleaseConn(cc)
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		// Canceled, or past the deadline: ctx says which.
		return 0, "", fmt.Errorf("%w (%v)", ctx.Err(), err)
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout):
		// The connection's deadline is the context's, reached before the
		// context's own timer fired.
		return 0, "", fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
	case errors.Is(err, fasthttp.ErrBodyTooLarge) && resp.StatusCode() != 0:
		// The status and the headers arrived; the body is longer than
		// anything worth reading: the answer is classified on what is there.
	default:
		return 0, "", err
	}
	status = resp.StatusCode()
	if status < 200 || status >= 300 {
		retryAfter = string(resp.Header.Peek("Retry-After"))
	}
	raw := resp.Body()
	if bytes.EqualFold(resp.Header.ContentEncoding(), []byte("gzip")) {
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err == nil {
			a.b, err = readBodyInto(a.b[:0], io.NopCloser(zr))
		}
		if err != nil {
			return 0, "", fmt.Errorf("reading the answer (status %d): %w", status, err)
		}
		return status, retryAfter, nil
	}
	a.b = append(a.b[:0], raw[:min(len(raw), maxResponseBody)]...)
	return status, retryAfter, nil
}

// headEnd ends every head: the transport's Accept-Encoding (net/http adds
// it after the request's own header) and the blank line.
const headEnd = "Accept-Encoding: gzip\r\n\r\n"

// headStart is a request's head as net/http begins it: the request line,
// Host and User-Agent. The request's own header follows, its keys sorted.
func headStart(d *directClient, method, path string) []byte {
	return fmt.Appendf(nil, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: %s\r\n", method, path, d.host, userAgent)
}

// postHead is the head of a POST of contentType with Authorization auth
// ("" for none), cut at the Content-Length value: before ends with
// "Content-Length: ", after holds the header's keys that follow it, sorted
// (Accept, Authorization, Content-Type), as net/http writes them. The
// caller ends after: with the idempotency key's line (Client) or headEnd.
func postHead(d *directClient, path, auth, contentType string) (before, after []byte) {
	before = append(headStart(d, http.MethodPost, path), "Content-Length: "...)
	after = []byte("\r\nAccept: application/json\r\n")
	if auth != "" {
		after = fmt.Appendf(after, "Authorization: %s\r\n", auth)
	}
	after = fmt.Appendf(after, "Content-Type: %s\r\n", contentType)
	return before, after
}

// appendHead appends a POST's head: before, the body's length n, after.
func appendHead(dst, before []byte, n int, after []byte) []byte {
	dst = append(dst, before...)
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, after...)
}

// appendPostHead appends a generic send's head: appendHead (after ends
// with "Idempotency-Key: "), the idempotency key and the end of the head.
func appendPostHead(dst, before, after []byte, n int, key string) ([]byte, error) {
	if !validHeaderValue(key) {
		return dst, errInvalidKey
	}
	dst = appendHead(dst, before, n, after)
	dst = append(dst, key...)
	return append(dst, "\r\n"+headEnd...), nil
}

// getHead is a lookup's GET of path (a request URI) with Authorization auth
// ("" for none), as net/http writes it.
func getHead(d *directClient, path, auth string) []byte {
	b := append(headStart(d, http.MethodGet, path), "Accept: application/json\r\n"...)
	if auth != "" {
		b = fmt.Appendf(b, "Authorization: %s\r\n", auth)
	}
	return append(b, headEnd...)
}

// validHeaderValue is net/http's check of a header value: no control byte
// but the tab.
func validHeaderValue(v string) bool {
	for i := range len(v) {
		if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return false
		}
	}
	return true
}
