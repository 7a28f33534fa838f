// Package webhook is the webhook channel's provider adapter: it turns a
// reminder into a signed HTTP request to the tenant's application and its
// answer into the worker's vocabulary. It exists for jobs that are not
// messages to a person, above all cleanup ("delete learner 42's expired
// draft 7"), where the row identifies what to remove and the request is made
// outside the web request that decided it.
//
// A cleanup is idempotent by nature: 404 and 410 mean the thing is already
// gone, which is the desired state, so they count as delivered, recorded as
// "already_absent" rather than "performed" (Result). Other 4xx are permanent
// (the request itself is wrong); 5xx, 429, 408, timeouts and dropped
// connections are retried by the worker with the same Idempotency-Key.
//
// Because the worker runs inside the operator's network, a target is
// reached only if the tenant's entry in the targets file lists its host, and
// only at an address Blocked does not refuse or the entry explicitly allows.
// The address check runs on the address being connected to, after DNS
// resolution, in the dialer itself: a name that resolves to a public address
// when checked and to 10.0.0.1 when dialled (DNS rebinding) is still refused.
// Each tenant has its own connection pool, so a connection one tenant was
// allowed to open is never reused for another; redirects are not followed
// and no proxy is used.
package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/pkg/webhooksig"
)

const (
	// DefaultTimeout bounds one request when Config.Timeout is zero.
	DefaultTimeout = 10 * time.Second
	// maxResponseBody bounds how much of a response is read (and quoted).
	maxResponseBody = 64 << 10
	maxErrorExcerpt = 200
	userAgent       = "nudge-webhook/1"
)

// The results a delivered webhook records as its provider id (the attempt's
// provider_message_id): "performed:204", "already_absent:404".
const (
	// ResultPerformed: the application answered 2xx; it did what was asked.
	ResultPerformed = "performed"
	// ResultAlreadyAbsent: it answered 404 or 410; the thing to remove was
	// already gone, which is the desired state.
	ResultAlreadyAbsent = "already_absent"
)

// Result splits a delivered webhook's provider id into its result
// (ResultPerformed or ResultAlreadyAbsent) and HTTP status; ok is false for
// an id the webhook channel did not write.
func Result(providerID string) (result string, status int, ok bool) {
	r, s, found := strings.Cut(providerID, ":")
	n, err := strconv.Atoi(s)
	if !found || err != nil || (r != ResultPerformed && r != ResultAlreadyAbsent) {
		return "", 0, false
	}
	return r, n, true
}

// ErrInvalidConfig is wrapped by every error New returns.
var ErrInvalidConfig = errors.New("invalid webhook config")

// errAddressNotAllowed is what the dialer refuses with.
var errAddressNotAllowed = errors.New("address not allowed for this tenant")

// Config configures a Sender.
type Config struct {
	// Targets says which hosts and networks each tenant may reach. Required.
	Targets *Targets
	// Secrets are the root signing secrets, each at least 32 bytes: every
	// request carries one signature per secret, under the tenant's secret
	// derived from it (webhooksig.TenantSecret), so a receiver holding
	// either of an old and a new secret verifies during a rotation.
	// At least one.
	Secrets [][]byte
	// Timeout bounds each request (connect, request, response) as a context
	// deadline. Zero means DefaultTimeout; negative is invalid.
	Timeout time.Duration
	// Now is the clock the signatures are dated by. Nil means time.Now.
	Now func() time.Time
}

// Sender makes webhook requests. It implements provider.Sender and is safe
// for concurrent use.
type Sender struct {
	targets *Targets
	secrets [][]byte
	timeout time.Duration
	now     func() time.Time

	mu      sync.Mutex
	clients map[string]*http.Client // per tenant
}

var _ provider.Sender = (*Sender)(nil)

// New validates cfg and returns a Sender.
func New(cfg Config) (*Sender, error) {
	if cfg.Targets == nil {
		return nil, fmt.Errorf("%w: Config.Targets is required", ErrInvalidConfig)
	}
	if len(cfg.Secrets) == 0 {
		return nil, fmt.Errorf("%w: at least one signing secret is required", ErrInvalidConfig)
	}
	for i, s := range cfg.Secrets {
		if len(s) < MinSecret {
			return nil, fmt.Errorf("%w: secret %d is %d bytes, want at least %d", ErrInvalidConfig, i+1, len(s), MinSecret)
		}
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: Config.Timeout must not be negative, got %s", ErrInvalidConfig, cfg.Timeout)
	}
	s := &Sender{
		targets: cfg.Targets, secrets: cfg.Secrets, timeout: cfg.Timeout, now: cfg.Now,
		clients: make(map[string]*http.Client),
	}
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// MinSecret is the shortest root secret New accepts, in bytes (the size of
// the HMAC-SHA256 output).
const MinSecret = 32

// request is what a reminder asks for.
type request struct {
	method string
	target *url.URL
	body   []byte // nil: none
}

// parse reads the target URL (the recipient) and the data's method and body,
// as intake validated them (nudge_invalid_webhook): checked again here, since
// a row may have been written by hand.
func parse(msg provider.Message) (request, error) {
	u, err := url.Parse(msg.Recipient)
	if err != nil {
		return request{}, fmt.Errorf("target URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.Fragment != "" {
		return request{}, fmt.Errorf("target %q must be an http or https URL without user info or fragment", msg.Recipient)
	}
	r := request{method: http.MethodDelete, target: u}
	if m, ok := msg.Data["method"]; ok {
		s, _ := m.(string)
		if s != http.MethodDelete && s != http.MethodPost && s != http.MethodPut {
			return request{}, fmt.Errorf(`method %v: want "DELETE", "POST" or "PUT"`, m)
		}
		r.method = s
	}
	if b, ok := msg.Data["body"]; ok {
		if r.method == http.MethodDelete {
			return request{}, errors.New(`a body needs method "POST" or "PUT"`)
		}
		if r.body, err = json.Marshal(b); err != nil {
			return request{}, fmt.Errorf("encoding the body: %w", err)
		}
	}
	return r, nil
}

// Send makes the reminder's request and returns its result as the provider
// id ("performed:204", "already_absent:410", see Result). Every error is a
// *provider.Error:
//
//   - "message": no idempotency key, or a target, method or body the channel
//     cannot send (permanent);
//   - "target_not_allowed": the tenant is not in the targets file, or its
//     entry lists neither the host nor (for http) allow_http (permanent);
//   - "address_not_allowed": the host resolves only to addresses the tenant
//     may not reach (permanent);
//   - "http_429", "http_408", "http_5NN": retryable, with RetryAfter from the
//     Retry-After header;
//   - "http_3NN" (redirects are not followed), "http_4NN": permanent;
//   - "timeout", "canceled", "network": retryable; the application may have
//     acted, and the retry carries the same Idempotency-Key.
func (s *Sender) Send(ctx context.Context, msg provider.Message) (string, error) {
	op := fmt.Sprintf("webhook of reminder %d", msg.ReminderID)
	if msg.IdempotencyKey == "" {
		return "", provider.PermanentError("message", fmt.Errorf("%s: empty idempotency key", op))
	}
	r, err := parse(msg)
	if err != nil {
		return "", provider.PermanentError("message", fmt.Errorf("%s: %w", op, err))
	}
	ten, ok := s.targets.Tenants[msg.Tenant]
	switch {
	case !ok:
		return "", provider.PermanentError("target_not_allowed", fmt.Errorf("%s: tenant %q has no entry in the targets file", op, msg.Tenant))
	case !ten.allowsHost(r.target.Hostname()):
		return "", provider.PermanentError("target_not_allowed",
			fmt.Errorf("%s: host %q is not among tenant %q's hosts in the targets file", op, r.target.Hostname(), msg.Tenant))
	case r.target.Scheme == "http" && !ten.AllowHTTP:
		return "", provider.PermanentError("target_not_allowed",
			fmt.Errorf("%s: plain http to %q: tenant %q's entry does not set allow_http", op, r.target.Host, msg.Tenant))
	}

	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, r.target.String(), body)
	if err != nil {
		return "", provider.PermanentError("message", fmt.Errorf("%s: %w", op, err))
	}
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set(webhooksig.IdempotencyHeader, msg.IdempotencyKey)
	req.Header.Set(webhooksig.ActionHeader, msg.Template)
	secrets := make([][]byte, len(s.secrets))
	for i, root := range s.secrets {
		secrets[i] = webhooksig.TenantSecret(root, msg.Tenant)
	}
	webhooksig.SignRequest(req, r.body, s.now(), secrets...)

	resp, err := s.client(msg.Tenant, ten).Do(req)
	if err != nil {
		return "", transportError(op, err)
	}
	excerpt, err := readBody(resp.Body)
	if err != nil {
		return "", transportError(fmt.Sprintf("%s: reading the response (status %d)", op, resp.StatusCode), err)
	}
	return interpret(resp, excerpt, s.now())
}

// interpret maps a response onto a result or a *provider.Error.
func interpret(resp *http.Response, body []byte, now time.Time) (string, error) {
	status := resp.StatusCode
	code := "http_" + strconv.Itoa(status)
	switch {
	case status >= 200 && status < 300:
		return ResultPerformed + ":" + strconv.Itoa(status), nil
	case status == http.StatusNotFound, status == http.StatusGone:
		return ResultAlreadyAbsent + ":" + strconv.Itoa(status), nil
	case status == http.StatusTooManyRequests, status == http.StatusRequestTimeout, status >= 500:
		return "", provider.RetryableError(code, sms.ParseRetryAfter(resp.Header.Get("Retry-After"), now), statusError(status, body))
	case status >= 300 && status < 500:
		return "", provider.PermanentError(code, statusError(status, body))
	default: // 1xx after the request: a broken server
		return "", provider.RetryableError(code, 0, statusError(status, body))
	}
}

func statusError(status int, body []byte) error {
	b := bytes.TrimSpace(body)
	if len(b) > maxErrorExcerpt {
		b = b[:maxErrorExcerpt]
	}
	return fmt.Errorf("the application answered %d %s: body %q", status, http.StatusText(status), b)
}

// readBody reads a bounded part of the body, drains a bounded amount more so
// the connection can be reused, and closes it.
func readBody(rc io.ReadCloser) ([]byte, error) {
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxResponseBody))
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(rc, maxResponseBody))
	return b, nil
}

// transportError classifies a request that got no complete answer: refused
// addresses are permanent; the rest are retryable, and the application may
// or may not have seen the request.
func transportError(op string, err error) error {
	wrapped := fmt.Errorf("%s: %w", op, err)
	var ne net.Error
	switch {
	case errors.Is(err, errAddressNotAllowed):
		return provider.PermanentError("address_not_allowed", wrapped)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return provider.RetryableError("timeout", 0, wrapped)
	case errors.Is(err, context.Canceled):
		return provider.RetryableError("canceled", 0, wrapped)
	default:
		return provider.RetryableError("network", 0, wrapped)
	}
}

// client returns the tenant's HTTP client, built once: its dialer refuses
// every address the tenant may not reach, at connect time.
func (s *Sender) client(tenant string, ten Tenant) *http.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.clients[tenant]; ok {
		return c
	}
	d := &net.Dialer{
		Timeout: s.timeout,
		// Control runs for each address the dialer tries, after resolution
		// and before connect: the address checked is the address used.
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %q: %w", errAddressNotAllowed, address, err)
			}
			if !ten.allowsAddr(ap.Addr()) {
				return fmt.Errorf("%w: %s", errAddressNotAllowed, ap.Addr())
			}
			return nil
		},
	}
	t := &http.Transport{
		Proxy:                 nil, // a proxy would be the address checked, not the target
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   s.timeout,
		ExpectContinueTimeout: time.Second,
	}
	c := &http.Client{
		Transport:     t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	s.clients[tenant] = c
	return c
}

// Close closes the idle connections of every tenant's client.
func (s *Sender) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.clients {
		c.CloseIdleConnections()
	}
}
