// Package sms delivers reminders through an HTTP SMS API and classifies every
// failure for the worker's retry decision.
//
// The adapter exists so the worker never has to know HTTP: it maps each
// response onto provider.Error. Timeouts, 429 and 5xx are retryable because
// the send may succeed later; other 4xx are permanent because repeating the
// same request cannot fix it. A timeout leaves the outcome unknown (the
// provider may have accepted). The generic API (Client) deduplicates on the
// Idempotency-Key every attempt of a reminder carries; Twilio's
// (TwilioClient, twilio.go) does not, so both adapters are also
// provider.Lookers: the worker asks the provider for an earlier attempt's
// message before it sends again, and records the reminder delivered when it
// is there. suite_test.go runs both through one behavioural suite against
// the fake provider (internal/fakesms).
//
// Message text is rendered here from text/template files named
// <name>.sms.tmpl, so a template error is found before anything is sent and
// ends the reminder as failed rather than retrying forever.
package sms

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"
	"unicode/utf8"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/redact"
)

const (
	// DefaultTimeout bounds one HTTP request when Config.Timeout is zero.
	DefaultTimeout = 10 * time.Second
	// MaxRetryAfter caps the wait a provider may request, so a bad header
	// cannot park a reminder past any useful deadline.
	MaxRetryAfter = time.Hour

	// messagesPath is appended to Config.URL.
	messagesPath = "v1/messages"
	// maxResponseBody bounds how much of a response is read.
	maxResponseBody = 64 << 10
	// maxPooledRender bounds the output buffer a render keeps for the next
	// one: an outsized message's buffer is left to the collector.
	maxPooledRender = 4 << 10
	// maxErrorExcerpt bounds the response body quoted in an error.
	maxErrorExcerpt = 200
	// templateSuffix names the template files LoadTemplates and
	// ParseTemplates read.
	templateSuffix = ".sms.tmpl"
)

var (
	// ErrInvalidConfig is wrapped by every error New returns.
	ErrInvalidConfig = errors.New("invalid sms config")
	// ErrUnknownTemplate means a message names a template that was not loaded.
	ErrUnknownTemplate = errors.New("unknown sms template")
	// ErrEmptyBody means a template rendered only whitespace.
	ErrEmptyBody = errors.New("sms template rendered an empty body")
)

// Config configures a Client.
type Config struct {
	// URL is the provider's base URL, absolute http or https, for example
	// "https://sms.example.com" or "https://gw.example.com/sms". Messages
	// are POSTed to URL + "/v1/messages". Required: the zero value is invalid.
	URL string
	// Token, when set, is sent as "Authorization: Bearer <Token>". The zero
	// value sends no Authorization header.
	Token string
	// Timeout bounds each send (connect, request and response) and is applied
	// as a context deadline, so it also holds with a caller's HTTPClient.
	// Zero means DefaultTimeout; negative is invalid.
	Timeout time.Duration
	// Sender is the "from" field (a number or alphanumeric sender ID). The
	// zero value omits it and lets the provider choose its default.
	Sender string
	// HTTPClient sends the requests. Nil means the direct client
	// (direct.go: each request written and its answer read on the sending
	// goroutine, HTTP/1.1, pooled connections closed after 30 s idle), or,
	// when the environment names a proxy for URL (HTTP_PROXY, HTTPS_PROXY,
	// NO_PROXY) or URL's host is not ASCII, net/http's client as
	// defaultHTTPClient builds it. Timeout applies to either.
	HTTPClient *http.Client
	// Templates renders message bodies. Nil means the embedded defaults
	// (DefaultTemplates).
	Templates *Templates
}

// Client sends SMS through the provider's HTTP API. It implements
// provider.Sender and is safe for concurrent use.
type Client struct {
	endpoint string
	post     *http.Request // the send's request without context, header or body
	auth     []string      // the Authorization header's value, nil when none
	token    string
	sender   string
	timeout  time.Duration
	// transport's postAfter ends with "Idempotency-Key: ".
	transport
	templates *Templates
	now       func() time.Time
}

var (
	_ provider.Looker  = (*Client)(nil)
	_ provider.Chooser = (*Client)(nil)
)

// Current names the provider every Send goes to: APIGeneric.
func (c *Client) Current() string { return APIGeneric }

// orDefaults returns timeout and tmpl, each replaced by its default
// (DefaultTimeout, DefaultTemplates) when zero: both clients' defaults.
func orDefaults(timeout time.Duration, tmpl *Templates) (time.Duration, *Templates) {
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if tmpl == nil {
		tmpl = DefaultTemplates()
	}
	return timeout, tmpl
}

// New validates cfg and returns a Client. Errors name the offending field and
// wrap ErrInvalidConfig.
func New(cfg Config) (*Client, error) {
	// Errors show the URL only in its redacted form: user info or a token
	// in the query would otherwise be printed.
	u, err := redact.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: Config.URL: %w", ErrInvalidConfig, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: Config.URL must be an absolute http or https URL, got %q", ErrInvalidConfig, redact.URL(cfg.URL))
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("%w: Config.URL must not carry a query, fragment or user info, got %q", ErrInvalidConfig, redact.URL(cfg.URL))
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: Config.Timeout must not be negative, got %s", ErrInvalidConfig, cfg.Timeout)
	}
	if strings.ContainsAny(cfg.Token, "\r\n") {
		return nil, fmt.Errorf("%w: Config.Token must not contain line breaks", ErrInvalidConfig)
	}
	timeout, tmpl := orDefaults(cfg.Timeout, cfg.Templates)
	endpoint := u.JoinPath(messagesPath).String()
	post, err := http.NewRequest(http.MethodPost, endpoint, http.NoBody)
	if err != nil {
		return nil, fmt.Errorf("%w: Config.URL: %w", ErrInvalidConfig, err)
	}
	var auth []string
	if cfg.Token != "" {
		auth = []string{"Bearer " + cfg.Token}
	}
	c := &Client{
		endpoint:  endpoint,
		post:      post,
		auth:      auth,
		token:     cfg.Token,
		sender:    cfg.Sender,
		timeout:   timeout,
		transport: newTransport(u, cfg.HTTPClient),
		templates: tmpl,
		now:       time.Now,
	}
	if c.direct != nil {
		c.postBefore, c.postAfter = postHead(c.direct, post.URL.RequestURI(), c.authorization(), "application/json")
		c.postAfter = append(c.postAfter, "Idempotency-Key: "...)
	}
	return c, nil
}

// defaultHTTPClient is net/http's client as New and NewTwilio use it when
// the direct client cannot serve (a proxy, a host that is not ASCII): a clone of
// http.DefaultTransport (proxies from the environment, HTTP/2) that keeps
// an idle connection for every send in flight. The default transport keeps
// 2 idle connections per host; a worker sends a batch concurrently to one
// provider host and would open and close a connection per send. A worker
// with its defaults has up to 4 × 50 = 200 sends in flight: with fewer idle
// connections kept than that, each wave of answers closes the surplus and
// the next wave dials it again (128 kept: 365–1,359 connections per 20,000
// sends in nudge-bench's procs runs, dials ~4.5% of the worker's CPU).
func defaultHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = 512, 256
	return &http.Client{Transport: t}
}

// templateData fills data with msg.Data plus the facts about the reminder,
// which win over caller data with the same key (as in the email channel, so
// one reminder's data renders on either).
func templateData(data map[string]any, msg provider.Message) {
	maps.Copy(data, msg.Data)
	data["reminder_id"] = msg.ReminderID
	data["tenant"] = msg.Tenant
	data["deadline"] = msg.Deadline
}

// renderState is what one render needs besides the template: the data map
// and the output buffer, reused across sends (a template cannot keep either:
// it gets the map as dot and writes to the buffer only while it executes).
type renderState struct {
	data   map[string]any
	values []any // a direct render's field values
	buf    bytes.Buffer
}

var renderStates = sync.Pool{New: func() any { return &renderState{data: make(map[string]any, 8)} }}

// acceptance is the part of a 2xx response body the client needs.
type acceptance struct {
	ID string `json:"id"`
}

// Send renders msg's template and posts it to the provider. It returns the
// provider's message id on acceptance; every error is a *provider.Error:
//
//   - "template": unknown template, template failure or empty body (permanent,
//     nothing is sent);
//   - provider.CodeNotStarted: msg.Gate refused the send (retryable, nothing
//     is sent);
//   - "message": no recipient or no idempotency key (permanent, as in the
//     email channel);
//   - "http_429", "http_408", "http_5NN": retryable, with RetryAfter from the
//     Retry-After header (capped at MaxRetryAfter);
//   - "http_4NN", "http_3NN": permanent;
//   - "timeout": Timeout or the caller's deadline passed, at any step of the
//     exchange (retryable; the provider may have accepted);
//   - "canceled": the caller's context was canceled (retryable);
//   - "network": the request could not complete (retryable);
//   - "bad_response": a 2xx without a readable id (retryable: the retry is
//     deduplicated and returns the id).
func (c *Client) Send(ctx context.Context, msg provider.Message) (string, error) {
	text, err := render(c.templates, msg, "sms")
	if err != nil {
		return "", err
	}
	ctx, cancel := provider.WithTimeout(ctx, c.timeout)
	defer cancel()
	if c.direct != nil {
		return c.sendDirect(ctx, msg, text)
	}
	// net/http's transport may still read the body after Do returns: the
	// payload is its own.
	payload := appendRequest(make([]byte, 0, requestSize(msg.Recipient, text, msg.Tenant, c.sender)),
		msg.Recipient, text, msg.ReminderID, msg.Tenant, c.sender)
	req := c.request(ctx, payload, msg.IdempotencyKey)

	// The caller's last check, once nothing but the request itself is left:
	// ctx (the caller's deadline, if earlier than Timeout) then bounds the
	// dial, the TLS handshake, the write and the read of the whole answer.
	if err := msg.Open(); err != nil {
		return "", err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", transportError(fmt.Sprintf("sending reminder %d by sms", msg.ReminderID), err)
	}
	rb := answers.Get().(*answer)
	defer rb.release()
	body, err := readBodyInto(rb.b[:0], resp.Body)
	rb.b = body
	if err != nil {
		// The status line arrived but the body did not: for a 2xx the
		// provider accepted and only the id is missing, so retrying with
		// the same key is safe either way.
		return "", transportError(fmt.Sprintf("reading sms response (status %d)", resp.StatusCode), err)
	}
	return c.interpret(resp.StatusCode, retryAfter(resp), body)
}

// sendDirect is the rest of Send through the direct client: the body of
// text is written into a pooled buffer, then copied behind the head.
func (c *Client) sendDirect(ctx context.Context, msg provider.Message, text string) (string, error) {
	body := requests.Get().(*request)
	defer body.release()
	body.b = appendRequest(body.b[:0], msg.Recipient, text, msg.ReminderID, msg.Tenant, c.sender)
	if err := msg.Open(); err != nil {
		return "", err
	}
	rq := requests.Get().(*request)
	defer rq.release()
	var err error
	if rq.b, err = appendPostHead(rq.b[:0], c.postBefore, c.postAfter, len(body.b), msg.IdempotencyKey); err != nil {
		return "", transportError(fmt.Sprintf("sending reminder %d by sms", msg.ReminderID), err)
	}
	rq.b = append(rq.b, body.b...)
	rb := answers.Get().(*answer)
	defer rb.release()
	status, wait, err := c.direct.exchange(ctx, rq.b, rb)
	if err != nil {
		return "", transportError(fmt.Sprintf("sending reminder %d by sms", msg.ReminderID), err)
	}
	return c.interpret(status, wait, rb.b)
}

// retryAfter is resp's Retry-After when its status may carry one.
func retryAfter(resp *http.Response) string {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return ""
	}
	return resp.Header.Get("Retry-After")
}

// Header values every send shares. A request's header map is its own, but
// these slices are never written: net/http only reads a request's header,
// and Header.Set replaces a value's slice instead of writing into it.
var (
	jsonContentType = []string{"application/json"}
	acceptJSON      = []string{"application/json"}
)

// request is the POST of payload with idempotency key key: c.post (the
// endpoint parsed once by New) with ctx, its own header and the body, as
// http.NewRequestWithContext would build it.
func (c *Client) request(ctx context.Context, payload []byte, key string) *http.Request {
	req := c.post.WithContext(ctx)
	h := make(http.Header, 4)
	h["Content-Type"] = jsonContentType
	h["Accept"] = acceptJSON
	h["Idempotency-Key"] = []string{key}
	if c.auth != nil {
		h["Authorization"] = c.auth
	}
	req.Header = h
	// The body's types are the ones net/http knows to be in memory (a
	// bytes.Reader in io.NopCloser): it then writes the headers and the
	// body with one write, not two (TestSendWritesRequestOnce).
	r := bytes.NewReader(payload)
	req.Body = io.NopCloser(r)
	req.ContentLength = int64(len(payload))
	// GetBody lets the transport send the request again on another
	// connection when a pooled one turns out closed before it was written.
	snapshot := *r
	req.GetBody = func() (io.ReadCloser, error) {
		r := snapshot
		return io.NopCloser(&r), nil
	}
	return req
}

// answer is a pooled buffer a send's answer is read into; it is released
// once the answer is interpreted (the id and the errors copy what they keep).
type answer struct{ b []byte }

var answers = sync.Pool{New: func() any { return &answer{b: make([]byte, 0, 512)} }}

func (a *answer) release() {
	if cap(a.b) <= maxPooledRender {
		a.b = a.b[:0]
		answers.Put(a)
	}
}

// Lookup asks the provider for the message accepted under msg's idempotency
// key: GET URL/v1/messages/{key}. The provider deduplicates, so a retry is
// safe without it; the worker asks anyway before retrying an attempt whose
// outcome is unknown, and before letting such a reminder expire, so the
// record says delivered when the recipient got the message. Errors: one
// wrapping provider.ErrNotFound on 404, a retryable *provider.Error when the
// provider could not answer.
func (c *Client) Lookup(ctx context.Context, msg provider.Message) (string, error) {
	if msg.IdempotencyKey == "" {
		return "", provider.PermanentError("message", fmt.Errorf("looking up reminder %d by sms: empty idempotency key", msg.ReminderID))
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	u, err := url.JoinPath(c.endpoint, url.PathEscape(msg.IdempotencyKey))
	if err != nil {
		return "", provider.PermanentError("message", fmt.Errorf("building sms lookup url: %w", err))
	}
	if c.direct != nil {
		return c.lookupDirect(ctx, msg, u)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", provider.PermanentError("message", fmt.Errorf("building sms lookup: %w", err))
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return "", transportError(fmt.Sprintf("looking up reminder %d by sms", msg.ReminderID), err)
	}
	body, err := readBody(resp.Body)
	if err != nil {
		return "", transportError(fmt.Sprintf("reading sms lookup response (status %d)", resp.StatusCode), err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return "", fmt.Errorf("looking up reminder %d by sms: %w", msg.ReminderID, provider.ErrNotFound)
	}
	return c.interpret(resp.StatusCode, retryAfter(resp), body)
}

// authorization is the Authorization header's value, "" when none.
func (c *Client) authorization() string {
	if c.auth == nil {
		return ""
	}
	return c.auth[0]
}

// lookupDirect is the rest of Lookup through the direct client: GET target.
func (c *Client) lookupDirect(ctx context.Context, msg provider.Message, target string) (string, error) {
	u, err := url.Parse(target)
	if err != nil {
		return "", provider.PermanentError("message", fmt.Errorf("building sms lookup url: %w", err))
	}
	rb := answers.Get().(*answer)
	defer rb.release()
	status, wait, err := c.direct.exchange(ctx, getHead(c.direct, u.RequestURI(), c.authorization()), rb)
	if err != nil {
		return "", transportError(fmt.Sprintf("looking up reminder %d by sms", msg.ReminderID), err)
	}
	if status == http.StatusNotFound {
		return "", fmt.Errorf("looking up reminder %d by sms: %w", msg.ReminderID, provider.ErrNotFound)
	}
	return c.interpret(status, wait, rb.b)
}

// interpret maps a complete response, its status, Retry-After (for a
// non-2xx) and body, onto an id or a *provider.Error.
func (c *Client) interpret(status int, retryAfter string, body []byte) (string, error) {
	if status >= 200 && status < 300 {
		return accepted(status, body)
	}
	code := "http_" + strconv.Itoa(status) // built for a refusal only: two allocations
	switch {
	case status == http.StatusTooManyRequests, status == http.StatusRequestTimeout, status >= 500:
		wait := ParseRetryAfter(retryAfter, c.now())
		return "", provider.RetryableError(code, wait, statusError(status, body))
	case status >= 300 && status < 500:
		return "", provider.PermanentError(code, statusError(status, body))
	default:
		return "", provider.RetryableError(code, 0, statusError(status, body))
	}
}

// accepted is the provider's id in a 2xx answer's body.
func accepted(status int, body []byte) (string, error) {
	var a acceptance
	var plain bool
	if a.ID, plain = acceptedID(body); !plain {
		if err := json.Unmarshal(body, &a); err != nil {
			return "", provider.RetryableError("bad_response", 0,
				fmt.Errorf("decoding sms response (status %d, body %s): %w", status, excerpt(body), err))
		}
	}
	if a.ID == "" {
		return "", provider.RetryableError("bad_response", 0,
			fmt.Errorf("sms provider accepted (status %d) without an id: body %s", status, excerpt(body)))
	}
	return a.ID, nil
}

// render checks what every adapter needs of msg and renders its body:
// errors are permanent *provider.Error ("message" or "template"), since
// nothing was sent and nothing would change on a retry. via names the
// adapter in them.
func render(t *Templates, msg provider.Message, via string) (string, error) {
	if msg.Recipient == "" {
		return "", provider.PermanentError("message", fmt.Errorf("sending reminder %d by %s: no recipient", msg.ReminderID, via))
	}
	if msg.IdempotencyKey == "" {
		return "", provider.PermanentError("message", fmt.Errorf("sending reminder %d by %s: empty idempotency key", msg.ReminderID, via))
	}
	st := renderStates.Get().(*renderState)
	defer func() {
		clear(st.data)
		st.buf.Reset()
		if st.buf.Cap() <= maxPooledRender {
			renderStates.Put(st)
		}
	}()
	text, err := t.renderMessage(msg, st)
	if err != nil {
		return "", provider.PermanentError("template", fmt.Errorf("sending reminder %d by %s: %w", msg.ReminderID, via, err))
	}
	return text, nil
}

// transportError classifies a failure to complete the HTTP exchange. All are
// retryable: the provider may or may not have seen the request.
func transportError(op string, err error) error {
	wrapped := fmt.Errorf("%s: %w", op, err)
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return provider.RetryableError("timeout", 0, wrapped)
	case errors.Is(err, context.Canceled):
		return provider.RetryableError("canceled", 0, wrapped)
	default:
		return provider.RetryableError("network", 0, wrapped)
	}
}

// readBody reads at most maxResponseBody bytes, then drains a bounded amount
// more so the connection can be reused, and closes the body.
func readBody(rc io.ReadCloser) ([]byte, error) {
	return readBodyInto(nil, rc)
}

// readBodyInto is readBody appending to b, growing it only as the answer
// needs (io.ReadAll starts at 512 bytes and grows by copies).
func readBodyInto(b []byte, rc io.ReadCloser) ([]byte, error) {
	defer rc.Close()
	for len(b) < maxResponseBody {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(max(cap(b), 512), maxResponseBody-len(b)))
		}
		n, err := rc.Read(b[len(b):min(cap(b), maxResponseBody)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil // the whole answer: nothing to drain
		}
		if err != nil {
			return nil, err
		}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(rc, maxResponseBody))
	return b, nil
}

func statusError(status int, body []byte) error {
	return fmt.Errorf("sms provider answered %d %s: body %s", status, http.StatusText(status), excerpt(body))
}

// excerpt quotes at most maxErrorExcerpt bytes of body, cut at a rune
// boundary, so errors stay short and single-line.
func excerpt(body []byte) string {
	b := bytes.TrimSpace(body)
	truncated := false
	if len(b) > maxErrorExcerpt {
		cut := maxErrorExcerpt
		for cut > maxErrorExcerpt-utf8.UTFMax && !utf8.RuneStart(b[cut]) {
			cut--
		}
		b = b[:cut]
		truncated = true
	}
	s := strconv.Quote(string(b))
	if truncated {
		s += "..."
	}
	return s
}

// ParseRetryAfter returns the wait an HTTP Retry-After value asks for, given
// the current time: delay-seconds or an HTTP-date. It returns zero for an
// empty, malformed, negative or past value, and caps the wait at
// MaxRetryAfter.
func ParseRetryAfter(value string, now time.Time) time.Duration {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0
	}
	if isDigits(value) {
		secs, err := strconv.ParseInt(value, 10, 64)
		if err != nil || secs > int64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter // only overflow fails for a digit string
		}
		return time.Duration(secs) * time.Second
	}
	at, err := http.ParseTime(value)
	if err != nil {
		return 0
	}
	return min(max(at.Sub(now), 0), MaxRetryAfter)
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

//go:embed templates/*.sms.tmpl
var embedded embed.FS

// Templates is a set of named message templates, immutable and safe for
// concurrent use once built.
//
// Send executes a template with msg.Data plus "reminder_id", "tenant" and
// "deadline" (a time.Time, zero when unset) as dot, with missingkey=zero. For
// a map[string]any a missing key still prints "<no value>", so templates
// guard optional fields: {{or .course "your course"}}, {{with .host}} on
// {{.}}{{end}}. Keys that are not identifiers are reached with
// {{index . "key-name"}}. One function is added: date formats a time.Time,
// *time.Time or RFC 3339 string as "2 Jan 2006" (or the layout given as a
// second argument) and returns "" for anything missing or zero, so
// {{with date .deadline}}on {{.}}{{else}}soon{{end}} never fails. The
// rendered text is trimmed of surrounding whitespace.
type Templates struct {
	byName map[string]fastTemplate
}

// DefaultTemplates returns the templates embedded in the binary:
// course-expiry, subscription-renewal and certificate-cleanup.
func DefaultTemplates() *Templates {
	t, err := ParseTemplates(embedded, "templates")
	if err != nil {
		panic(fmt.Sprintf("sms: embedded templates do not parse: %v", err)) // a build bug, caught by tests
	}
	return t
}

// ParseTemplates parses every <name>.sms.tmpl file directly inside dir of
// fsys ("." for its root). Subdirectories and other files are ignored.
func ParseTemplates(fsys fs.FS, dir string) (*Templates, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("reading sms templates: %w", err)
	}
	t := &Templates{byName: make(map[string]fastTemplate)}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), templateSuffix)
		if !ok || name == "" || !e.Type().IsRegular() {
			continue
		}
		path := e.Name()
		if dir != "." {
			path = dir + "/" + e.Name()
		}
		src, err := fs.ReadFile(fsys, path)
		if err != nil {
			return nil, fmt.Errorf("reading sms template %s: %w", path, err)
		}
		parsed, err := template.New(name).Option("missingkey=zero").Funcs(funcs).Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("parsing sms template %s: %w", path, err)
		}
		t.byName[name] = newFastTemplate(parsed)
	}
	return t, nil
}

// LoadTemplates returns the embedded defaults overlaid with the
// <name>.sms.tmpl files in dir: a file with a default's name replaces it, any
// other name adds a template. An empty dir means the defaults alone. A dir
// that does not exist or holds no template files is an error, since that is
// almost certainly a misconfiguration.
func LoadTemplates(dir string) (*Templates, error) {
	t := DefaultTemplates()
	if dir == "" {
		return t, nil
	}
	info, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("loading sms templates: %w", err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("loading sms templates: %s is not a directory", dir)
	}
	overrides, err := ParseTemplates(os.DirFS(dir), ".")
	if err != nil {
		return nil, fmt.Errorf("loading sms templates from %s: %w", dir, err)
	}
	if len(overrides.byName) == 0 {
		return nil, fmt.Errorf("loading sms templates: no *%s files in %s", templateSuffix, dir)
	}
	for name, tmpl := range overrides.byName {
		t.byName[name] = tmpl
	}
	return t, nil
}

// funcs are the functions every template can call.
var funcs = template.FuncMap{"date": formatDate}

// defaultDateLayout is short, because an SMS is.
const defaultDateLayout = "2 Jan 2006"

// formatDate formats v with layout (default defaultDateLayout), returning ""
// for nil, zero or unparseable values, so a template can fall back with
// {{with}}.
func formatDate(v any, layout ...string) string {
	l := defaultDateLayout
	if len(layout) > 0 && layout[0] != "" {
		l = layout[0]
	}
	var t time.Time
	switch x := v.(type) {
	case time.Time:
		t = x
	case *time.Time:
		if x != nil {
			t = *x
		}
	case string:
		parsed, err := time.Parse(time.RFC3339, x)
		if err != nil {
			return ""
		}
		t = parsed
	}
	if t.IsZero() {
		return ""
	}
	return t.Format(l)
}

// Names returns the template names, sorted.
func (t *Templates) Names() []string {
	names := make([]string, 0, len(t.byName))
	for name := range t.byName {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Render executes the named template with data. Errors wrap
// ErrUnknownTemplate or ErrEmptyBody, or carry the template's own failure.
func (t *Templates) Render(name string, data map[string]any) (string, error) {
	var b bytes.Buffer
	return t.render(name, data, &b)
}

// render is Render writing through b, an empty buffer the caller may reuse.
func (t *Templates) render(name string, data map[string]any, b *bytes.Buffer) (string, error) {
	tmpl, ok := t.byName[name]
	if !ok {
		return "", fmt.Errorf("rendering %q: %w", name, ErrUnknownTemplate)
	}
	if err := tmpl.execute(b, data); err != nil {
		return "", fmt.Errorf("rendering %q: %w", name, err)
	}
	return renderedText(name, b)
}

// renderMessage is render of msg's template on templateData's map of msg,
// through st's buffer (empty) and map (empty).
func (t *Templates) renderMessage(msg provider.Message, st *renderState) (string, error) {
	tmpl, ok := t.byName[msg.Template]
	if !ok {
		return "", fmt.Errorf("rendering %q: %w", msg.Template, ErrUnknownTemplate)
	}
	if err := tmpl.executeMessage(&st.buf, msg, st); err != nil {
		return "", fmt.Errorf("rendering %q: %w", msg.Template, err)
	}
	return renderedText(msg.Template, &st.buf)
}

// renderedText is a render's text, trimmed, or ErrEmptyBody.
func renderedText(name string, b *bytes.Buffer) (string, error) {
	text := bytes.TrimSpace(b.Bytes())
	if len(text) == 0 {
		return "", fmt.Errorf("rendering %q: %w", name, ErrEmptyBody)
	}
	return string(text), nil
}
