package sms

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/redact"
)

// This file is the Twilio adapter: Twilio's Programmable Messaging REST API
// (Message resource, API version 2010-04-01).
//
// Twilio does not deduplicate a repeated create: a retry after a timeout
// that Twilio had in fact accepted is a second text on the recipient's
// phone. So the worker never retries an attempt whose outcome is unknown
// without asking first (Lookup), and Lookup must be able to recognise the
// message an earlier attempt left. A Twilio message has no field for a
// caller's metadata, and the list API does not return the StatusCallback
// URL, so the reference goes in the body: every message ends with a line
// "ref <10 hex digits>", the first 40 bits of the SHA-256 of the reminder's
// idempotency key (Reference). Lookup lists the messages to the recipient
// from the configured sender, newest first, back to the earliest unknown
// attempt, and matches that line (or fetches by SID when an attempt recorded
// one). The list is not filtered by DateSent: a message Twilio still queues
// has no date_sent yet, and it is exactly the one a timeout leaves.

const (
	// DefaultTwilioURL is Twilio's API host.
	DefaultTwilioURL = "https://api.twilio.com"
	// twilioAPIVersion is the path segment of the API version spoken.
	twilioAPIVersion = "2010-04-01"
	// lookupSlack widens the lookup window backwards, for the clock skew
	// between a worker and Twilio.
	lookupSlack = 2 * time.Minute
	// lookupPageSize and lookupMaxPages bound a lookup's listing: up to
	// 500 messages to one recipient since the earliest unknown attempt.
	lookupPageSize = 50
	lookupMaxPages = 10
)

// ErrNoTwilioSender means neither a From number nor a messaging service was
// configured.
var ErrNoTwilioSender = errors.New("twilio needs a From number or a messaging service SID")

// TwilioConfig configures a TwilioClient.
type TwilioConfig struct {
	// URL is the API's base URL. Zero value: DefaultTwilioURL. Tests point
	// it at cmd/fake-sms, which serves the same routes.
	URL string
	// AccountSID and AuthToken are the HTTP basic auth credentials and
	// name the account in every path. Required.
	AccountSID string
	AuthToken  string
	// From is the sending number or alphanumeric sender ID; or
	// MessagingServiceSID picks one from a messaging service. Exactly one
	// is required.
	From                string
	MessagingServiceSID string
	// StatusCallback, when set, is sent with every create, with the query
	// parameter nudge_ref=<Reference> added, so a receiver can match
	// delivery reports (30xxx errors arrive there, not in the create's
	// answer). The zero value asks for no callbacks.
	StatusCallback string
	// Timeout bounds each request, as in Config. Zero: DefaultTimeout.
	Timeout time.Duration
	// HTTPClient sends the requests. Nil: the direct client, as for
	// Config.HTTPClient (direct.go), or net/http's client as
	// defaultHTTPClient builds it when the environment names a proxy for
	// URL or URL's host is not ASCII.
	HTTPClient *http.Client
	// Templates renders message bodies. Nil: DefaultTemplates.
	Templates *Templates
}

// TwilioClient sends SMS through Twilio. It implements provider.Looker and
// is safe for concurrent use.
type TwilioClient struct {
	messages string   // .../Accounts/{sid}/Messages
	origin   string   // scheme://host, for next_page_uri
	auth     []string // the Authorization header's value: basic auth with the account SID and auth token
	from     string
	service  string
	callback string
	timeout  time.Duration
	// transport's postAfter ends the create's head.
	transport
	templates *Templates
	now       func() time.Time
}

var (
	_ provider.Looker  = (*TwilioClient)(nil)
	_ provider.Chooser = (*TwilioClient)(nil)
)

// Current names the provider every Send goes to: APITwilio.
func (c *TwilioClient) Current() string { return APITwilio }

// NewTwilio validates cfg and returns a TwilioClient. Errors wrap
// ErrInvalidConfig and never quote the auth token.
func NewTwilio(cfg TwilioConfig) (*TwilioClient, error) {
	if cfg.URL == "" {
		cfg.URL = DefaultTwilioURL
	}
	u, err := redact.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: TwilioConfig.URL: %w", ErrInvalidConfig, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.User != nil {
		return nil, fmt.Errorf("%w: TwilioConfig.URL must be an absolute http or https URL without query or user info, got %q",
			ErrInvalidConfig, redact.URL(cfg.URL))
	}
	switch {
	case cfg.AccountSID == "" || strings.ContainsAny(cfg.AccountSID, "/?#:\r\n"):
		return nil, fmt.Errorf("%w: TwilioConfig.AccountSID is required and must be a SID (AC...)", ErrInvalidConfig)
	case cfg.AuthToken == "" || strings.ContainsAny(cfg.AuthToken, "\r\n"):
		return nil, fmt.Errorf("%w: TwilioConfig.AuthToken is required, on one line", ErrInvalidConfig)
	case (cfg.From == "") == (cfg.MessagingServiceSID == ""):
		return nil, fmt.Errorf("%w: %w (exactly one of them)", ErrInvalidConfig, ErrNoTwilioSender)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: TwilioConfig.Timeout must not be negative, got %s", ErrInvalidConfig, cfg.Timeout)
	}
	if cfg.StatusCallback != "" {
		cb, err := url.Parse(cfg.StatusCallback)
		if err != nil || (cb.Scheme != "http" && cb.Scheme != "https") || cb.Host == "" {
			return nil, fmt.Errorf("%w: TwilioConfig.StatusCallback must be an absolute http or https URL, got %q",
				ErrInvalidConfig, redact.URL(cfg.StatusCallback))
		}
	}
	timeout, tmpl := orDefaults(cfg.Timeout, cfg.Templates)
	messages := u.JoinPath(twilioAPIVersion, "Accounts", cfg.AccountSID, "Messages").String()
	create, err := url.Parse(messages + ".json") // as net/http parses the create's URL
	if err != nil {
		return nil, fmt.Errorf("%w: TwilioConfig.URL: %w", ErrInvalidConfig, err)
	}
	c := &TwilioClient{
		messages:  messages,
		origin:    u.Scheme + "://" + u.Host,
		auth:      []string{"Basic " + base64.StdEncoding.EncodeToString([]byte(cfg.AccountSID+":"+cfg.AuthToken))},
		from:      cfg.From,
		service:   cfg.MessagingServiceSID,
		callback:  cfg.StatusCallback,
		timeout:   timeout,
		transport: newTransport(u, cfg.HTTPClient),
		templates: tmpl,
		now:       time.Now,
	}
	if c.direct != nil {
		c.postBefore, c.postAfter = postHead(c.direct, create.RequestURI(), c.auth[0], formContentType)
		c.postAfter = append(c.postAfter, headEnd...)
	}
	return c, nil
}

// formContentType is a create's Content-Type.
const formContentType = "application/x-www-form-urlencoded"

// Reference is the reference line a Twilio message of the reminder with
// idempotency key key ends with: "ref " and the first 10 hex digits of the
// key's SHA-256.
func Reference(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "ref " + hex.EncodeToString(sum[:5])
}

// twilioMessage is the part of Twilio's Message resource the client reads.
type twilioMessage struct {
	SID                 string `json:"sid"`
	To                  string `json:"to"`
	From                string `json:"from"`
	MessagingServiceSID string `json:"messaging_service_sid"`
	Body                string `json:"body"`
	Status              string `json:"status"`
	ErrorCode           *int   `json:"error_code"`
	DateCreated         string `json:"date_created"`
}

// twilioError is Twilio's error body.
type twilioError struct {
	Code     int    `json:"code"`
	Message  string `json:"message"`
	MoreInfo string `json:"more_info"`
	Status   int    `json:"status"`
}

// Send renders msg's template, adds the reference line and creates the
// message. It returns the message SID; errors are *provider.Error with the
// codes of Client.Send, except that a refusal carrying a Twilio error code
// is "twilio_<code>" (21211 invalid To number, 21610 unsubscribed
// recipient, 20003 authentication: permanent), 429 and Twilio's 20429 are
// retryable with Retry-After, and so is every 5xx. Delivery failures after
// acceptance (30xxx) are not in the create's answer: they reach the status
// callback, and Lookup reports them.
func (c *TwilioClient) Send(ctx context.Context, msg provider.Message) (string, error) {
	text, err := render(c.templates, msg, "twilio")
	if err != nil {
		return "", err
	}
	ref := Reference(msg.IdempotencyKey)
	form := url.Values{"To": {msg.Recipient}, "Body": {text + "\n" + ref}}
	if c.from != "" {
		form.Set("From", c.from)
	} else {
		form.Set("MessagingServiceSid", c.service)
	}
	if c.callback != "" {
		cb, _ := url.Parse(c.callback) // validated by NewTwilio
		q := cb.Query()
		q.Set("nudge_ref", strings.TrimPrefix(ref, "ref "))
		cb.RawQuery = q.Encode()
		form.Set("StatusCallback", cb.String())
	}
	op := fmt.Sprintf("sending reminder %d by twilio", msg.ReminderID)
	// The caller's last check (the deadline margin), once nothing but
	// building and sending the request is left.
	if err := msg.Open(); err != nil {
		return "", err
	}
	rb := answers.Get().(*answer)
	defer rb.release()
	status, wait, err := c.do(ctx, rb, http.MethodPost, c.messages+".json", form.Encode())
	if err != nil {
		return "", transportError(op, err)
	}
	body := rb.b
	if status >= 200 && status < 300 {
		var m twilioMessage
		if err := json.Unmarshal(body, &m); err != nil || m.SID == "" {
			// Accepted, but which message is unknown: the worker looks it
			// up before any retry (Twilio would not deduplicate one).
			return "", provider.RetryableError("bad_response", 0,
				fmt.Errorf("%s: twilio accepted (status %d) without a readable sid: body %s", op, status, excerpt(body)))
		}
		return m.SID, nil
	}
	return "", c.refusal(op, status, wait, body)
}

// refusal classifies a non-2xx answer, with its Retry-After.
func (c *TwilioClient) refusal(op string, status int, retryAfter string, body []byte) *provider.Error {
	var te twilioError
	_ = json.Unmarshal(body, &te)
	err := fmt.Errorf("%s: twilio answered %d (code %d): %s", op, status, te.Code, excerpt([]byte(te.Message)))
	if te.Code == 0 {
		err = fmt.Errorf("%s: %w", op, statusError(status, body))
	}
	switch {
	case status == http.StatusTooManyRequests, te.Code == 20429, status == http.StatusRequestTimeout, status >= 500:
		return provider.RetryableError("http_"+strconv.Itoa(status), ParseRetryAfter(retryAfter, c.now()), err)
	case te.Code != 0:
		return provider.PermanentError("twilio_"+strconv.Itoa(te.Code), err)
	case status >= 300 && status < 500:
		return provider.PermanentError("http_"+strconv.Itoa(status), err)
	}
	return provider.RetryableError("http_"+strconv.Itoa(status), 0, err)
}

// do sends one request with basic auth (form, encoded, as the body of a
// POST; "" for a GET) and reads the answer into a: its status, Retry-After
// (for a non-2xx) and body.
func (c *TwilioClient) do(ctx context.Context, a *answer, method, target, form string) (int, string, error) {
	ctx, cancel := provider.WithTimeout(ctx, c.timeout)
	defer cancel()
	if c.direct != nil {
		return c.doDirect(ctx, a, method, target, form)
	}
	var req *http.Request
	var err error
	if method == http.MethodPost {
		req, err = http.NewRequestWithContext(ctx, method, target, strings.NewReader(form))
		if err == nil {
			req.Header.Set("Content-Type", formContentType)
		}
	} else {
		req, err = http.NewRequestWithContext(ctx, method, target, nil)
	}
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Accept", "application/json")
	// What req.SetBasicAuth(sid, token) sets, built once by NewTwilio: the
	// slice is shared by every request and never written (net/http only
	// reads a request's header; TestTwilioWireFormat).
	req.Header["Authorization"] = c.auth
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	if a.b, err = readBodyInto(a.b[:0], resp.Body); err != nil {
		return 0, "", fmt.Errorf("reading the answer (status %d): %w", resp.StatusCode, err)
	}
	return resp.StatusCode, retryAfter(resp), nil
}

// doDirect is do through the direct client: the create's head is the one
// NewTwilio wrote, a GET's is written for its target (TestTwilioWireFormat
// holds both to what net/http writes).
func (c *TwilioClient) doDirect(ctx context.Context, a *answer, method, target, form string) (int, string, error) {
	rq := requests.Get().(*request)
	defer rq.release()
	if method == http.MethodPost {
		rq.b = appendHead(rq.b[:0], c.postBefore, len(form), c.postAfter)
		rq.b = append(rq.b, form...)
	} else {
		u, err := url.Parse(target)
		if err != nil {
			return 0, "", err
		}
		rq.b = getHead(c.direct, u.RequestURI(), c.auth[0])
	}
	return c.direct.exchange(ctx, rq.b, a)
}

// Lookup finds the message an earlier attempt of msg's reminder left at
// Twilio: by SID when an attempt recorded one, else by listing the
// recipient's messages from this sender, newest first, back to the earliest
// attempt in msg.Earlier (less lookupSlack), and matching the reference line.
// It returns the SID of a message Twilio holds; a permanent *provider.Error
// "twilio_<code>" when that message failed or was undelivered (a 30xxx
// error: it reached Twilio and will not reach the phone; sending it again
// would not help); an error wrapping provider.ErrNotFound when there is
// none; and a retryable *provider.Error when Twilio could not be asked.
func (c *TwilioClient) Lookup(ctx context.Context, msg provider.Message) (string, error) {
	op := fmt.Sprintf("looking up reminder %d at twilio", msg.ReminderID)
	rb := answers.Get().(*answer)
	defer rb.release()
	for _, e := range msg.Earlier {
		if e.ProviderID == "" {
			continue
		}
		status, wait, err := c.do(ctx, rb, http.MethodGet, c.messages+"/"+url.PathEscape(e.ProviderID)+".json", "")
		if err != nil {
			return "", transportError(op, err)
		}
		body := rb.b
		if status == http.StatusNotFound {
			continue
		}
		if status != http.StatusOK {
			return "", c.lookupError(op, status, wait, body)
		}
		var m twilioMessage
		if err := json.Unmarshal(body, &m); err != nil {
			return "", provider.RetryableError("bad_response", 0, fmt.Errorf("%s: decoding %s: %w", op, excerpt(body), err))
		}
		return c.found(op, m)
	}

	ref := Reference(msg.IdempotencyKey)
	since := msg.Since().Add(-lookupSlack)
	q := url.Values{"To": {msg.Recipient}, "PageSize": {strconv.Itoa(lookupPageSize)}}
	if c.from != "" {
		q.Set("From", c.from)
	}
	next := c.messages + ".json?" + q.Encode()
	for range lookupMaxPages {
		status, wait, err := c.do(ctx, rb, http.MethodGet, next, "")
		if err != nil {
			return "", transportError(op, err)
		}
		body := rb.b
		if status != http.StatusOK {
			return "", c.lookupError(op, status, wait, body)
		}
		var page struct {
			Messages    []twilioMessage `json:"messages"`
			NextPageURI *string         `json:"next_page_uri"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return "", provider.RetryableError("bad_response", 0, fmt.Errorf("%s: decoding a page %s: %w", op, excerpt(body), err))
		}
		older := false
		for _, m := range page.Messages {
			if created, err := time.Parse(time.RFC1123Z, m.DateCreated); err == nil && !since.IsZero() && created.Before(since) {
				older = true // newest first: the rest are older still
				break
			}
			if c.service != "" && m.MessagingServiceSID != c.service {
				continue
			}
			if strings.HasSuffix(strings.TrimSpace(m.Body), ref) {
				return c.found(op, m)
			}
		}
		if older || page.NextPageURI == nil || *page.NextPageURI == "" {
			return "", fmt.Errorf("%s: %w", op, provider.ErrNotFound)
		}
		next = c.origin + *page.NextPageURI
	}
	// Hundreds of messages to one recipient since the attempt: do not
	// guess; the caller neither sends nor concludes, and asks again later.
	return "", provider.RetryableError("lookup_incomplete", 0,
		fmt.Errorf("%s: more than %d messages to the recipient since %s", op, lookupPageSize*lookupMaxPages, since.Format(time.RFC3339)))
}

// found judges a message Lookup found.
func (c *TwilioClient) found(op string, m twilioMessage) (string, error) {
	switch m.Status {
	case "failed", "undelivered", "canceled":
		code := "twilio_" + m.Status
		if m.ErrorCode != nil && *m.ErrorCode != 0 {
			code = "twilio_" + strconv.Itoa(*m.ErrorCode)
		}
		return "", provider.PermanentError(code, fmt.Errorf("%s: message %s is %s", op, m.SID, m.Status))
	}
	return m.SID, nil
}

// lookupError classifies a failed lookup request: retryable, since the
// message may exist whatever the lookup answered, except for Twilio's
// permanent refusals (bad credentials), which would fail every send too.
func (c *TwilioClient) lookupError(op string, status int, retryAfter string, body []byte) error {
	pe := c.refusal(op, status, retryAfter, body)
	if pe.Kind == provider.Permanent {
		// A permanent refusal of the lookup says nothing about the
		// message: never conclude "failed" from it.
		return provider.RetryableError("lookup_"+pe.Code, 0, pe.Err)
	}
	return pe
}
