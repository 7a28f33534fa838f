package sms

import (
	"context"
	"crypto/hmac"
	"crypto/sha1" //nolint:gosec // Twilio signs with HMAC-SHA1; its security rests on the HMAC.
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/clock"
)

// This file receives Twilio's status callbacks: Twilio POSTs a message's
// delivery status (sent, delivered, undelivered or failed with a 30xxx
// error code) to the StatusCallback URL the adapter sends with each create.
// A 30xxx error is a carrier's refusal after Twilio accepted: it never shows
// in the create's answer, only here (and in a later fetch). The receiver
// verifies X-Twilio-Signature as Twilio documents it (HMAC-SHA1, keyed with
// the account's auth token, over the full URL Twilio requested followed by
// the POST parameters sorted by name, each name then its value; base64),
// answers 403 to a request that does not carry a valid one, and records the
// status by message SID (store.MessageStatus), only forward. It never moves
// a reminder: a reminder Twilio accepted is delivered as far as Nudge's
// contract goes; a later carrier refusal is a fact about the message,
// recorded beside it.
//
// It runs in sms-worker (--twilio-callback-listen), on a listener of its
// own: the worker already holds the auth token and a login that may write
// the statuses, and any replica can take any callback (the state is in
// PostgreSQL), so no Deployment of its own is needed; its port is the only
// one to expose to Twilio.

const (
	// TwilioSignatureHeader carries Twilio's request signature.
	TwilioSignatureHeader = "X-Twilio-Signature"
	// maxCallbackBody bounds a status callback's body: Twilio's are well
	// under 2 KiB.
	maxCallbackBody = 16 << 10
	// callbackTimeout bounds recording one status.
	callbackTimeout = 5 * time.Second
)

// twilioSIDPattern is a message SID: SM or MM and 32 hex digits.
var twilioSIDPattern = regexp.MustCompile(`^(SM|MM)[0-9a-fA-F]{32}$`)

// StatusRank orders Twilio's message statuses, so a late report of an
// earlier one ("sent" after "delivered") is ignored. Zero: not a status a
// status callback reports for an outbound message.
func StatusRank(status string) int {
	switch status {
	case "accepted", "scheduled", "queued":
		return 1
	case "sending":
		return 2
	case "sent":
		return 3
	case "delivered", "undelivered", "failed", "canceled":
		return 4
	case "read":
		return 5
	}
	return 0
}

// TwilioSignature is the X-Twilio-Signature of a request to fullURL (as
// Twilio requested it, query included) with POST parameters form, signed
// with authToken.
func TwilioSignature(authToken, fullURL string, form url.Values) string {
	var b strings.Builder
	b.WriteString(fullURL)
	keys := make([]string, 0, len(form))
	for k := range form {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		vs := slices.Clone(form[k])
		slices.Sort(vs)
		for _, v := range vs {
			b.WriteString(k)
			b.WriteString(v)
		}
	}
	mac := hmac.New(sha1.New, []byte(authToken))
	mac.Write([]byte(b.String()))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// StatusRecorder records a reported status (*store.Store).
type StatusRecorder interface {
	MessageStatus(ctx context.Context, now time.Time, sid, status string, rank, errorCode int) (bool, error)
}

// Callbacks is the status-callback receiver, an http.Handler.
type Callbacks struct {
	token  string
	origin string // scheme://host Twilio calls, from the configured callback URL
	rec    StatusRecorder
	clock  clock.Clock
	log    zerolog.Logger
}

// NewCallbacks returns the receiver of the callbacks Twilio sends to
// callbackURL (TwilioConfig.StatusCallback: its scheme and host are what
// Twilio signed, whatever a proxy in front makes of them), verified with
// authToken and recorded by rec.
func NewCallbacks(authToken, callbackURL string, rec StatusRecorder, clk clock.Clock, log zerolog.Logger) (*Callbacks, error) {
	u, err := url.Parse(callbackURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: the status callback URL must be an absolute http or https URL to verify callbacks against", ErrInvalidConfig)
	}
	if authToken == "" {
		return nil, fmt.Errorf("%w: verifying status callbacks needs the Twilio auth token", ErrInvalidConfig)
	}
	return &Callbacks{token: authToken, origin: u.Scheme + "://" + u.Host, rec: rec, clock: clk, log: log}, nil
}

// ServeHTTP verifies and records one status callback: 204 when recorded
// (or older than the status recorded), 403 for a missing or wrong
// signature, 400 for a body that is not a status callback, 413 for one over
// 16 KiB, 503 when the status could not be recorded (Twilio may retry).
func (c *Callbacks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "status callbacks are POSTed", http.StatusMethodNotAllowed)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxCallbackBody)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, "body over 16 KiB", http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "body: want application/x-www-form-urlencoded: "+err.Error(), http.StatusBadRequest)
		return
	}
	want := TwilioSignature(c.token, c.origin+r.URL.RequestURI(), r.PostForm)
	got := r.Header.Get(TwilioSignatureHeader)
	if got == "" || !hmac.Equal([]byte(got), []byte(want)) {
		c.log.Warn().Str("remote", r.RemoteAddr).Msg("twilio status callback refused: missing or wrong " + TwilioSignatureHeader)
		http.Error(w, "missing or wrong "+TwilioSignatureHeader, http.StatusForbidden)
		return
	}
	sid, status, code, err := parseCallback(r.PostForm)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), callbackTimeout)
	defer cancel()
	recorded, err := c.rec.MessageStatus(ctx, c.clock.Now(), sid, status, StatusRank(status), code)
	if err != nil {
		c.log.Error().Err(err).Str("sid", sid).Msg("twilio status callback not recorded")
		http.Error(w, "not recorded", http.StatusServiceUnavailable)
		return
	}
	ev := c.log.Debug()
	if code != 0 {
		ev = c.log.Info()
	}
	ev.Str("sid", sid).Str("status", status).Int("error_code", code).Bool("recorded", recorded).Msg("twilio status callback")
	w.WriteHeader(http.StatusNoContent)
}

// parseCallback reads a status callback's fields, naming the one that is
// wrong: MessageSid (a message SID), MessageStatus (an outbound message's
// status) and ErrorCode (optional, a number).
func parseCallback(form url.Values) (sid, status string, code int, err error) {
	sid, status = form.Get("MessageSid"), form.Get("MessageStatus")
	if !twilioSIDPattern.MatchString(sid) {
		return "", "", 0, fmt.Errorf("MessageSid: want SM or MM and 32 hex digits, got %q", excerpt([]byte(sid)))
	}
	if StatusRank(status) == 0 {
		return "", "", 0, fmt.Errorf("MessageStatus: want queued, sending, sent, delivered, undelivered, failed, canceled or read, got %q",
			excerpt([]byte(status)))
	}
	if v := form.Get("ErrorCode"); v != "" {
		code, err = strconv.Atoi(v)
		if err != nil || code < 0 {
			return "", "", 0, fmt.Errorf("ErrorCode: want a number, got %q", excerpt([]byte(v)))
		}
	}
	return sid, status, code, nil
}

// ServeCallbacks serves h on addr until ctx ends, then shuts it down. It
// returns once the listener is bound (an error if it cannot be).
func ServeCallbacks(ctx context.Context, addr string, h http.Handler, log zerolog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--twilio-callback-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("twilio status callbacks: server stopped")
		}
	}()
	log.Info().Str("addr", ln.Addr().String()).Msg("receiving twilio status callbacks")
	return nil
}
