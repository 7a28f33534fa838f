package fakesms

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// FastServer serves a Server over TCP at a fraction of net/http's server's
// CPU per request, for a harness that sends a fake provider tens of
// thousands of messages a second on the machine it measures (nudge-bench).
//
// One request shape takes the short path: "POST /v1/messages HTTP/1.1"
// (the generic API's send) with a Host, a Content-Length of at most 1 MiB
// and no Connection, Expect or Transfer-Encoding header, whose head is
// well formed and fits in the connection's read buffer. Its *http.Request is
// built on the connection's goroutine, without the context, header
// parsing or background read of net/http's server, and is served by the
// same handler as through ServeHTTP (handleSend, so records, faults and
// answers are the Server's); the answer is written byte for byte as
// net/http writes it (TestFastServerWire). Anything else, and any request
// while the Config could delay or stall a send, is handed with its
// connection, unread, to a net/http server serving the same Server, which
// keeps the connection from then on: the control API, lookups, the
// Twilio routes, malformed requests, and delays and stalls that watch the
// client go away.
//
// A send that takes the short path while a concurrent PUT /control starts
// a delay or a stall still waits as configured, but cannot see its client
// go away (it records ClientGone only when Close cuts the wait short).
type FastServer struct {
	s        *Server
	srv      *http.Server
	handoff  *handoffListener
	accepted atomic.Int64
	// short counts the requests served on the short path.
	short atomic.Int64

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	closed bool
}

// fastReadBuffer is a connection's read buffer: a short-path request's head
// and body must fit in it (a larger one goes to net/http).
const fastReadBuffer = 16 << 10

// NewFastServer returns a FastServer for s.
func NewFastServer(s *Server) *FastServer {
	f := &FastServer{s: s, handoff: newHandoffListener(), conns: make(map[net.Conn]struct{})}
	f.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	return f
}

// Accepted is the number of TCP connections accepted so far.
func (f *FastServer) Accepted() int64 { return f.accepted.Load() }

// Serve accepts connections on ln until Close, and returns
// http.ErrServerClosed then.
func (f *FastServer) Serve(ln net.Listener) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return http.ErrServerClosed
	}
	f.ln = ln
	f.mu.Unlock()
	slow := make(chan error, 1)
	go func() { slow <- f.srv.Serve(f.handoff) }()
	for {
		c, err := ln.Accept()
		if err != nil {
			f.mu.Lock()
			closed := f.closed
			f.mu.Unlock()
			if closed {
				<-slow
				return http.ErrServerClosed
			}
			return err
		}
		f.accepted.Add(1)
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			_ = c.Close()
			continue
		}
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		go f.serveConn(c)
	}
}

// Close stops accepting, closes every connection (those handed to net/http
// too) and returns once Serve can return. It does not Close the Server.
func (f *FastServer) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	ln := f.ln
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	f.handoff.close()
	return f.srv.Close()
}

// forget drops c from the connections Close closes.
func (f *FastServer) forget(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// sendURL is the URL of every short-path request.
var sendURL = &url.URL{Path: "/v1/messages"}

// serveConn serves c's requests on the short path until one does not fit it,
// then hands c to net/http.
func (f *FastServer) serveConn(c net.Conn) {
	br := bufio.NewReaderSize(c, fastReadBuffer)
	bw := bufio.NewWriterSize(c, 4096)
	w := &fastWriter{header: make(http.Header, 2)}
	req := &http.Request{Method: http.MethodPost, URL: sendURL, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		RequestURI: "/v1/messages", RemoteAddr: c.RemoteAddr().String()}
	body := &bytes.Reader{}
	h := fastHead{header: make(http.Header, 8)}
	for {
		head, n, ok := peekHead(br)
		if n < 0 {
			// The connection ended or failed between requests.
			f.forget(c)
			_ = c.Close()
			return
		}
		clear(h.header)
		if ok {
			ok = h.parse(head) && f.s.instant()
		}
		if !ok {
			f.forget(c)
			if !f.handoff.give(&handedConn{Conn: c, r: br}) {
				_ = c.Close()
			}
			return
		}
		if _, err := br.Discard(n); err != nil {
			f.forget(c)
			_ = c.Close()
			return
		}
		b, err := br.Peek(int(h.length))
		if err != nil {
			f.forget(c)
			_ = c.Close()
			return
		}
		// The handler reads the body before it returns, and nothing reads
		// br meanwhile, so it reads the buffer in place.
		body.Reset(b)
		req.Header, req.Host, req.ContentLength = h.header, h.host, h.length
		req.Body = io.NopCloser(body)
		w.reset()
		f.short.Add(1)
		f.s.handleSend(w, req)
		_, _ = br.Discard(len(b))
		if err := w.writeTo(bw); err != nil {
			f.forget(c)
			_ = c.Close()
			return
		}
	}
}

// instant reports whether the Config answers every send at once: no delay,
// no stall outcome scripted or drawn.
func (s *Server) instant() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.Delay > 0 || s.cfg.RateTimeoutAfterAccept > 0 {
		return false
	}
	for _, o := range s.cfg.Script {
		if o == Timeout || o == TimeoutAfterAccept {
			return false
		}
	}
	return true
}

// peekHead returns the buffered head of the next request (through its blank
// line) and its length, without consuming it; ok is false when the head does
// not fit in the buffer (or the connection ended inside it), and n is -1
// when the connection ended or failed before the request's first byte.
func peekHead(br *bufio.Reader) (head []byte, n int, ok bool) {
	if _, err := br.Peek(1); err != nil {
		return nil, -1, false
	}
	for {
		b, _ := br.Peek(br.Buffered())
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			return b[:i+4], i + 4, true
		}
		if br.Buffered() == br.Size() {
			return nil, 0, false
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return nil, 0, false
		}
	}
}

// fastHead is a short-path request's head.
type fastHead struct {
	header http.Header
	host   string
	length int64
}

// requestLine is the only request line the short path serves.
const requestLine = "POST /v1/messages HTTP/1.1\r\n"

// parse reads head, and reports whether the request fits the short path:
// every line a well-formed "Name: value" (no continuation lines), exactly one
// Host and one Content-Length (digits, at most maxRequestBody, and its body
// within the read buffer), no Connection, Expect, Transfer-Encoding or
// Trailer. Values are trimmed and names canonicalised as net/http does.
func (h *fastHead) parse(head []byte) bool {
	rest, found := bytes.CutPrefix(head, []byte(requestLine))
	if !found {
		return false
	}
	h.host, h.length = "", 0
	hosts, lengths := 0, 0
	for len(rest) > 2 {
		i := bytes.Index(rest, []byte("\r\n"))
		line := rest[:i]
		rest = rest[i+2:]
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return false
		}
		name := line[:colon]
		for _, c := range name {
			if !tokenByte(c) {
				return false
			}
		}
		value := trimOWS(line[colon+1:])
		for _, c := range value {
			if c < ' ' && c != '\t' || c == 0x7f {
				return false
			}
		}
		key := canonicalKey(name)
		switch key {
		case "Connection", "Expect", "Transfer-Encoding", "Trailer", "Te", "Upgrade":
			return false
		case "Host":
			// A host of letters, digits and . - : [ ] _ only: net/http
			// judges any other (and refuses some).
			for _, c := range value {
				if !hostByte(c) {
					return false
				}
			}
			hosts++
			h.host = string(value)
			continue
		case "Content-Length":
			lengths++
			if len(value) == 0 || len(value) > 8 {
				return false
			}
			var n int64
			for _, c := range value {
				if c < '0' || c > '9' {
					return false
				}
				n = n*10 + int64(c-'0')
			}
			h.length = n
		}
		h.header[key] = append(h.header[key], string(value))
	}
	return hosts == 1 && lengths == 1 && h.length <= maxRequestBody &&
		int(h.length)+len(head) <= fastReadBuffer
}

// knownKeys are the header names a send carries, canonical: canonicalKey
// returns them without allocating.
var knownKeys = []string{"Host", "Content-Length", "Content-Type", "Idempotency-Key", "Authorization",
	"User-Agent", "Accept-Encoding", "Accept", "Connection", "Transfer-Encoding", "Expect"}

// canonicalKey is http.CanonicalHeaderKey(string(name)).
func canonicalKey(name []byte) string {
	for _, k := range knownKeys {
		if string(name) == k {
			return k
		}
	}
	return http.CanonicalHeaderKey(string(name))
}

// hostByte reports whether c may appear in a Host the short path serves.
func hostByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return bytes.IndexByte([]byte(".-:[]_"), c) >= 0
}

func tokenByte(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return bytes.IndexByte([]byte("!#$%&'*+-.^_`|~"), c) >= 0
}

func trimOWS(b []byte) []byte {
	return bytes.Trim(b, " \t")
}

// fastWriter is the short path's http.ResponseWriter: it keeps what the
// handler writes and then writes it as net/http's server does for an answer
// whose handler set its headers, wrote one status and a body of at most
// 2,048 bytes (every answer of the send route): the status line, the
// handler's headers sorted, Date, Content-Length, the body.
type fastWriter struct {
	header http.Header
	status int
	body   []byte
	line   []byte
}

func (w *fastWriter) reset() {
	clear(w.header)
	w.status = 0
	w.body = w.body[:0]
}

func (w *fastWriter) Header() http.Header { return w.header }

func (w *fastWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *fastWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.body = append(w.body, b...)
	return len(b), nil
}

// writeTo writes the answer to bw and flushes it.
func (w *fastWriter) writeTo(bw *bufio.Writer) error {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	l := append(w.line[:0], "HTTP/1.1 "...)
	l = strconv.AppendInt(l, int64(w.status), 10)
	l = append(l, ' ')
	if text := http.StatusText(w.status); text != "" {
		l = append(l, text...)
	} else {
		l = append(l, "status code "...)
		l = strconv.AppendInt(l, int64(w.status), 10)
	}
	l = append(l, "\r\n"...)
	keys := make([]string, 0, len(w.header))
	for k := range w.header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range w.header[k] {
			l = append(l, k...)
			l = append(l, ": "...)
			l = append(l, v...)
			l = append(l, "\r\n"...)
		}
	}
	l = append(l, "Date: "...)
	l = time.Now().UTC().AppendFormat(l, http.TimeFormat)
	l = append(l, "\r\nContent-Length: "...)
	l = strconv.AppendInt(l, int64(len(w.body)), 10)
	l = append(l, "\r\n\r\n"...)
	w.line = l
	_, _ = bw.Write(l)
	_, _ = bw.Write(w.body)
	return bw.Flush()
}

// handedConn is a connection handed to net/http with what is already
// buffered of it.
type handedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *handedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// handoffListener is the net.Listener net/http's server accepts handed-off
// connections from.
type handoffListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newHandoffListener() *handoffListener {
	return &handoffListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// give hands c to the net/http server, or reports false once closed.
func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) close() { l.once.Do(func() { close(l.done) }) }

func (l *handoffListener) Close() error {
	l.close()
	return nil
}

func (l *handoffListener) Addr() net.Addr { return handoffAddr{} }

type handoffAddr struct{}

func (handoffAddr) Network() string { return "tcp" }
func (handoffAddr) String() string  { return "fakesms-handoff" }
