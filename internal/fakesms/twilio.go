package fakesms

import (
	"context"
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // Twilio's signature algorithm
	"encoding/base64"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file is the fake's Twilio dialect: the Message resource of Twilio's
// Programmable Messaging REST API (version 2010-04-01), as much of it as
// Nudge's adapter uses. Create is form-encoded with HTTP basic auth (account
// SID and auth token); answers and errors are JSON; there is no idempotency
// key, so every accepted create is a new message. Faults are the same plan
// as the generic API's, answered in Twilio's error shape.

// twilioAPIBase is the path every Twilio route starts with.
const twilioAPIBase = "/2010-04-01/Accounts/"

// Twilio error codes the fake answers with.
const (
	twilioInvalidTo      = 21211 // the To number is not a valid phone number
	twilioMissingBody    = 21602
	twilioMissingFrom    = 21603
	twilioMissingTo      = 21604
	twilioTooManyReqs    = 20429
	twilioAuthFailed     = 20003
	twilioNotFound       = 20404
	undeliveredCode      = 30003 // unreachable destination handset
	defaultTwilioPageLen = 50
	maxTwilioPageLen     = 1000
)

// e164 is what Twilio accepts as a To number here.
var e164 = regexp.MustCompile(`^\+[1-9][0-9]{6,14}$`)

// twilioAccount is the account the Twilio routes serve.
type twilioAccount struct {
	sid, token string
}

// WithTwilioAccount makes the Twilio routes serve only account sid and
// require HTTP basic auth with sid and token (Twilio answers 401, code
// 20003, otherwise). Without it, any account SID in the path is served and
// credentials are not checked.
func WithTwilioAccount(sid, token string) Option {
	return func(s *Server) { s.twilio = twilioAccount{sid: sid, token: token} }
}

func (s *Server) twilioRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST "+twilioAPIBase+"{account}/Messages.json", func(w http.ResponseWriter, r *http.Request) {
		s.serveSend(w, r, twilioDialect{acct: s.twilio})
	})
	mux.HandleFunc("GET "+twilioAPIBase+"{account}/Messages.json", s.handleTwilioList)
	mux.HandleFunc("GET "+twilioAPIBase+"{account}/Messages/{sid}", s.handleTwilioFetch)
}

// twilioSID is a Twilio-shaped SID: a two-letter prefix and 32 hex digits.
func twilioSID(prefix string, n uint64) string { return fmt.Sprintf("%s%032x", prefix, n) }

// twilioDialect is the Twilio create.
type twilioDialect struct{ acct twilioAccount }

func (twilioDialect) name() string { return APITwilio }

func (twilioDialect) key(*http.Request) string { return "" }

// authorized checks the path's account and the basic auth.
func (a twilioAccount) authorized(r *http.Request) *refusal {
	if a.sid == "" {
		return nil
	}
	user, pass, ok := r.BasicAuth()
	if r.PathValue("account") != a.sid || !ok || user != a.sid || pass != a.token {
		return &refusal{status: http.StatusUnauthorized, code: twilioAuthFailed, reason: "Authenticate"}
	}
	return nil
}

func (d twilioDialect) parse(r *http.Request, body []byte) (sendRequest, *refusal) {
	if bad := d.acct.authorized(r); bad != nil {
		return sendRequest{}, bad
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return sendRequest{}, &refusal{status: http.StatusBadRequest, reason: "invalid form body: " + err.Error()}
	}
	req := sendRequest{To: form.Get("To"), Body: form.Get("Body"), From: form.Get("From"),
		Service: form.Get("MessagingServiceSid"), Callback: form.Get("StatusCallback")}
	switch {
	case req.To == "":
		return req, &refusal{status: http.StatusBadRequest, code: twilioMissingTo, reason: "A 'To' phone number is required."}
	case !e164.MatchString(req.To):
		return req, &refusal{status: http.StatusBadRequest, code: twilioInvalidTo,
			reason: fmt.Sprintf("The 'To' number %s is not a valid phone number.", req.To)}
	case req.From == "" && req.Service == "":
		return req, &refusal{status: http.StatusBadRequest, code: twilioMissingFrom, reason: "A 'From' phone number is required."}
	case req.Body == "":
		return req, &refusal{status: http.StatusBadRequest, code: twilioMissingBody, reason: "Message body is required."}
	}
	return req, nil
}

func (d twilioDialect) accepted(w http.ResponseWriter, m *Message, _ bool) {
	v := twilioMessage(d.acct.sid, *m)
	v["status"], v["date_sent"] = "queued", nil // as Twilio answers a create
	if m.Service != "" {
		v["status"] = "accepted"
	}
	writeJSON(w, http.StatusCreated, v)
}

func (twilioDialect) failed(w http.ResponseWriter, f refusal, retryAfter int) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	writeTwilioError(w, f)
}

// writeTwilioError writes Twilio's error JSON. An injected status gets the
// code Twilio would give it: 429 → 20429, 400 → 21211, others 20000+status.
func writeTwilioError(w http.ResponseWriter, f refusal) {
	code := f.code
	if code == 0 {
		switch f.status {
		case http.StatusTooManyRequests:
			code = twilioTooManyReqs
		case http.StatusBadRequest:
			code = twilioInvalidTo
		default:
			code = 20000 + f.status
		}
	}
	writeJSON(w, f.status, map[string]any{"code": code, "message": f.reason,
		"more_info": "https://www.twilio.com/docs/errors/" + strconv.Itoa(code), "status": f.status})
}

// twilioTime is Twilio's date format (RFC 2822).
func twilioTime(t time.Time) string { return t.UTC().Format(time.RFC1123Z) }

// twilioMessage renders m as Twilio's Message resource.
func twilioMessage(acct string, m Message) map[string]any {
	if acct == "" {
		acct = twilioSID("AC", 0)
	}
	var errCode any
	if m.ErrorCode != 0 {
		errCode = m.ErrorCode
	}
	var service any
	if m.Service != "" {
		service = m.Service
	}
	return map[string]any{
		"sid": m.ID, "account_sid": acct, "to": m.To, "from": m.From, "messaging_service_sid": service,
		"body": m.Body, "status": m.Status, "direction": "outbound-api", "api_version": "2010-04-01",
		"num_segments": "1", "num_media": "0", "price": nil, "price_unit": "USD",
		"error_code": errCode, "error_message": nil,
		"date_created": twilioTime(m.AcceptedAt), "date_updated": twilioTime(m.AcceptedAt),
		"date_sent": twilioTime(m.AcceptedAt),
		"uri":       twilioAPIBase + acct + "/Messages/" + m.ID + ".json",
	}
}

// twilioMessages returns the Twilio messages (newest first) for which keep
// is true, counting one lookup.
func (s *Server) twilioMessages(keep func(*Message) bool) []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups++
	var out []Message
	for i := len(s.messages) - 1; i >= 0; i-- {
		if m := s.messages[i]; m.API == APITwilio && keep(m) {
			out = append(out, *m)
		}
	}
	return out
}

func (s *Server) handleTwilioFetch(w http.ResponseWriter, r *http.Request) {
	if bad := s.twilio.authorized(r); bad != nil {
		writeTwilioError(w, *bad)
		return
	}
	sid, ok := strings.CutSuffix(r.PathValue("sid"), ".json")
	found := s.twilioMessages(func(m *Message) bool { return ok && m.ID == sid })
	if len(found) == 0 {
		writeTwilioError(w, refusal{status: http.StatusNotFound, code: twilioNotFound,
			reason: fmt.Sprintf("The requested resource %s was not found", r.URL.Path)})
		return
	}
	writeJSON(w, http.StatusOK, twilioMessage(s.twilio.sid, found[0]))
}

// handleTwilioList lists messages newest first, filtered by To, From and
// DateSent (a UTC date, YYYY-MM-DD, or an RFC 3339 time; "DateSent>" and
// "DateSent<" are on-or-after and on-or-before, which is how Twilio's
// "DateSent>=" reaches a server), a page of PageSize at a time.
func (s *Server) handleTwilioList(w http.ResponseWriter, r *http.Request) {
	if bad := s.twilio.authorized(r); bad != nil {
		writeTwilioError(w, *bad)
		return
	}
	q := r.URL.Query()
	var bounds [3]time.Time // exact day, on or after, on or before
	for i, k := range []string{"DateSent", "DateSent>", "DateSent<"} {
		if v := q.Get(k); v != "" {
			t, err := parseTwilioDate(v)
			if err != nil {
				writeTwilioError(w, refusal{status: http.StatusBadRequest, code: 20001, reason: k + ": " + err.Error()})
				return
			}
			bounds[i] = t
		}
	}
	size, page := defaultTwilioPageLen, 0
	if v, err := strconv.Atoi(q.Get("PageSize")); err == nil && v > 0 {
		size = min(v, maxTwilioPageLen)
	}
	if v, err := strconv.Atoi(q.Get("Page")); err == nil && v > 0 {
		page = v
	}
	day := func(t time.Time) time.Time { return t.UTC().Truncate(24 * time.Hour) }
	all := s.twilioMessages(func(m *Message) bool {
		sent := day(m.AcceptedAt)
		return (q.Get("To") == "" || m.To == q.Get("To")) &&
			(q.Get("From") == "" || m.From == q.Get("From")) &&
			(bounds[0].IsZero() || sent.Equal(day(bounds[0]))) &&
			(bounds[1].IsZero() || !m.AcceptedAt.Before(bounds[1])) &&
			(bounds[2].IsZero() || !sent.After(day(bounds[2])))
	})
	from := min(page*size, len(all))
	to := min(from+size, len(all))
	msgs := make([]map[string]any, 0, to-from)
	for _, m := range all[from:to] {
		msgs = append(msgs, twilioMessage(s.twilio.sid, m))
	}
	pageURI := func(p int) string {
		v := url.Values{}
		for k, vs := range q {
			v[k] = slices.Clone(vs)
		}
		v.Set("PageSize", strconv.Itoa(size))
		v.Set("Page", strconv.Itoa(p))
		return r.URL.Path + "?" + v.Encode()
	}
	var next any
	if to < len(all) {
		next = pageURI(page + 1)
	}
	writeJSON(w, http.StatusOK, map[string]any{"messages": msgs, "page": page, "page_size": size,
		"start": from, "end": max(to-1, from), "uri": pageURI(page), "first_page_uri": pageURI(0),
		"next_page_uri": next, "previous_page_uri": nil})
}

func parseTwilioDate(v string) (time.Time, error) {
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	return time.Parse(time.RFC3339, v)
}

// callBack posts a new Twilio message's status changes to its
// StatusCallback URL, in the background: "sent", then "delivered", or
// "undelivered" with its ErrorCode, each signed as Twilio signs them
// (X-Twilio-Signature, with the account's auth token: WithTwilioAccount).
// Failures are ignored, as Twilio's own retries are out of scope.
func (s *Server) callBack(m *Message, dup bool) {
	if dup || m.API != APITwilio || m.StatusCallback == "" {
		return
	}
	s.mu.Lock()
	msg := *m
	s.mu.Unlock()
	final := "delivered"
	if msg.Status == "undelivered" {
		final = "undelivered"
	}
	s.callbacks.Add(1)
	go func() {
		defer s.callbacks.Done()
		hc := &http.Client{Timeout: 5 * time.Second}
		for _, status := range []string{"sent", final} {
			form := url.Values{"MessageSid": {msg.ID}, "SmsSid": {msg.ID}, "MessageStatus": {status},
				"AccountSid": {s.twilio.sid}, "To": {msg.To}, "From": {msg.From}, "ApiVersion": {"2010-04-01"}}
			if status == "undelivered" {
				form.Set("ErrorCode", strconv.Itoa(msg.ErrorCode))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, msg.StatusCallback, strings.NewReader(form.Encode()))
			if err == nil {
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("X-Twilio-Signature", twilioSignature(s.twilio.token, msg.StatusCallback, form))
				if resp, err := hc.Do(req); err == nil {
					_ = resp.Body.Close()
				}
			}
			cancel()
		}
	}()
}

// twilioSignature is Twilio's request signature: the base64 HMAC-SHA1,
// keyed with the auth token, of the URL it requests followed by every POST
// parameter, sorted by name, as name then value.
func twilioSignature(token, target string, form url.Values) string {
	var b strings.Builder
	b.WriteString(target)
	for _, k := range slices.Sorted(maps.Keys(form)) {
		for _, v := range slices.Sorted(slices.Values(form[k])) {
			b.WriteString(k + v)
		}
	}
	mac := hmac.New(sha1.New, []byte(token))
	mac.Write([]byte(b.String()))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}
