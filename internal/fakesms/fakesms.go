// Package fakesms is an SMS provider for development and tests that behaves
// like a real one where Nudge's guarantees depend on it.
//
// It deduplicates on the Idempotency-Key header, because "once per logical
// reminder" rests on a provider that turns a retry into a no-op. It can
// answer 429 with Retry-After, 5xx and 4xx, delay its answers, and accept a
// message and then stall past the client's timeout: the failure that leaves
// a worker not knowing whether it sent. Faults are set at runtime through Go
// methods or an HTTP control API, either as a FIFO script of outcomes or as
// probabilities drawn from a seeded generator, so any run can be reproduced.
//
// Every attempt and message is kept in memory without bound: that suits a
// test or a development session, not a long soak. POST /reset (or Reset)
// clears them.
//
// It also speaks Twilio's Programmable Messaging API (create, fetch, list,
// status callbacks), which does not deduplicate: a repeated create is a
// second message, counted as such, so a client's lookup-before-retry is
// tested for real.
//
// Routes:
//
//	POST /v1/messages   send (the provider API sms.Client speaks)
//	GET  /v1/messages/{key}  the message accepted under an idempotency key
//	POST /2010-04-01/Accounts/{sid}/Messages.json         Twilio create
//	GET  /2010-04-01/Accounts/{sid}/Messages.json         Twilio list (To, From, DateSent, PageSize, Page)
//	GET  /2010-04-01/Accounts/{sid}/Messages/{msid}.json  Twilio fetch
//	GET  /control       current Config
//	PUT  /control       replace Config
//	POST /reset         clear records and Config
//	GET  /messages      accepted messages
//	GET  /attempts      every attempt
//	GET  /stats         counts
//	GET  /healthz       liveness
package fakesms

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nudgehq/nudge/internal/clock"
)

// Outcome is what the fake does with one valid send request: one of the
// named outcomes below, or an HTTP status from 400 to 599 written as its
// digits ("429", "503", "400"). A 429 carries Retry-After when
// Config.RetryAfterSeconds is positive.
type Outcome string

const (
	// Accept accepts the message (or, for a known key, answers as a duplicate).
	Accept Outcome = "accept"
	// TimeoutAfterAccept accepts and records the message, then stalls for
	// Config.Stall before answering as Accept would, or until the client
	// gives up when Stall is zero.
	TimeoutAfterAccept Outcome = "timeout_after_accept"
	// AcceptUndelivered accepts, and the carrier then refuses the message:
	// a Twilio message ends "undelivered" with error 30003, reported by
	// status callback (the generic API treats it as Accept).
	AcceptUndelivered Outcome = "accept_undelivered"
	// Timeout stalls like TimeoutAfterAccept without accepting, then answers
	// 504.
	Timeout Outcome = "timeout"
)

// The APIs the fake speaks, as Attempt.API and Message.API name them.
const (
	APIGeneric = "generic"
	APITwilio  = "twilio"
)

// Statuses the probabilities produce.
const (
	status5xx = http.StatusServiceUnavailable
	status4xx = http.StatusBadRequest
	// statusClientGone records an attempt whose client went away during
	// Config.Delay, before the fake decided anything (nginx's convention).
	statusClientGone = 499
	// maxRequestBody bounds a request body the fake will read.
	maxRequestBody = 1 << 20
)

// Validate reports whether o is a known outcome.
func (o Outcome) Validate() error {
	switch o {
	case Accept, TimeoutAfterAccept, Timeout, AcceptUndelivered:
		return nil
	}
	if code, err := strconv.Atoi(string(o)); err == nil && code >= 400 && code <= 599 && len(o) == 3 {
		return nil
	}
	return fmt.Errorf("unknown outcome %q: want accept, accept_undelivered, timeout_after_accept, timeout or a status 400-599", string(o))
}

// status returns the HTTP status of a status outcome, zero for named ones.
func (o Outcome) status() int {
	code, err := strconv.Atoi(string(o))
	if err != nil {
		return 0
	}
	return code
}

// Config is the fault plan. The zero value accepts every valid request at
// once. On each valid send, the head of Script is used if there is one;
// otherwise one number is drawn from the generator seeded with Seed and
// compared against the rates, in the order 429, 5xx (503), 4xx (400),
// timeout after accept; the remainder accepts.
type Config struct {
	// Rate429, Rate5xx, Rate4xx and RateTimeoutAfterAccept are
	// probabilities in [0, 1]; their sum must not exceed 1. Zero disables.
	Rate429                float64
	Rate5xx                float64
	Rate4xx                float64
	RateTimeoutAfterAccept float64
	// Delay is waited before every valid send is decided. Zero answers at
	// once. A client that gives up during Delay is recorded with status 499
	// and nothing is accepted.
	Delay time.Duration
	// Stall is how long Timeout and TimeoutAfterAccept stall before
	// answering. Zero stalls until the client goes away (or Close).
	Stall time.Duration
	// RetryAfterSeconds is sent as Retry-After on 429s. Zero sends no header.
	RetryAfterSeconds int
	// Seed seeds the generator; setting a Config reseeds it, so the same
	// Config and the same requests give the same outcomes. Zero is a valid
	// seed.
	Seed uint64
	// Script holds outcomes for the next len(Script) valid sends, taking
	// priority over the rates. Config() reports what is left of it.
	Script []Outcome
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	rates := []struct {
		name string
		v    float64
	}{
		{"rate_429", c.Rate429},
		{"rate_5xx", c.Rate5xx},
		{"rate_4xx", c.Rate4xx},
		{"rate_timeout_after_accept", c.RateTimeoutAfterAccept},
	}
	var sum float64
	for _, r := range rates {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return fmt.Errorf("%s must be in [0, 1], got %v", r.name, r.v)
		}
		sum += r.v
	}
	if sum > 1+1e-9 {
		return fmt.Errorf("rates must sum to at most 1, got %v", sum)
	}
	if c.Delay < 0 {
		return fmt.Errorf("delay must not be negative, got %s", c.Delay)
	}
	if c.Stall < 0 {
		return fmt.Errorf("stall must not be negative, got %s", c.Stall)
	}
	if c.RetryAfterSeconds < 0 {
		return fmt.Errorf("retry_after must not be negative, got %d", c.RetryAfterSeconds)
	}
	for i, o := range c.Script {
		if err := o.Validate(); err != nil {
			return fmt.Errorf("script[%d]: %w", i, err)
		}
	}
	return nil
}

// configJSON is Config on the wire: durations as Go duration strings
// ("250ms"), retry_after in seconds like the header.
type configJSON struct {
	Rate429                float64   `json:"rate_429"`
	Rate5xx                float64   `json:"rate_5xx"`
	Rate4xx                float64   `json:"rate_4xx"`
	RateTimeoutAfterAccept float64   `json:"rate_timeout_after_accept"`
	Delay                  string    `json:"delay"`
	Stall                  string    `json:"stall"`
	RetryAfter             int       `json:"retry_after"`
	Seed                   uint64    `json:"seed"`
	Script                 []Outcome `json:"script"`
}

// MarshalJSON writes the control API's shape.
func (c Config) MarshalJSON() ([]byte, error) {
	script := c.Script
	if script == nil {
		script = []Outcome{}
	}
	return json.Marshal(configJSON{
		Rate429:                c.Rate429,
		Rate5xx:                c.Rate5xx,
		Rate4xx:                c.Rate4xx,
		RateTimeoutAfterAccept: c.RateTimeoutAfterAccept,
		Delay:                  c.Delay.String(),
		Stall:                  c.Stall.String(),
		RetryAfter:             c.RetryAfterSeconds,
		Seed:                   c.Seed,
		Script:                 script,
	})
}

// UnmarshalJSON reads the control API's shape. Unknown fields are an error,
// so a misspelt rate is not silently ignored; omitted fields are zero.
func (c *Config) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var w configJSON
	if err := dec.Decode(&w); err != nil {
		return fmt.Errorf("decoding fakesms config: %w", err)
	}
	out := Config{
		Rate429:                w.Rate429,
		Rate5xx:                w.Rate5xx,
		Rate4xx:                w.Rate4xx,
		RateTimeoutAfterAccept: w.RateTimeoutAfterAccept,
		RetryAfterSeconds:      w.RetryAfter,
		Seed:                   w.Seed,
		Script:                 w.Script,
	}
	for _, d := range []struct {
		name string
		raw  string
		dst  *time.Duration
	}{{"delay", w.Delay, &out.Delay}, {"stall", w.Stall, &out.Stall}} {
		if d.raw == "" {
			continue
		}
		v, err := time.ParseDuration(d.raw)
		if err != nil {
			return fmt.Errorf("decoding fakesms config: %s: %w", d.name, err)
		}
		*d.dst = v
	}
	*c = out
	return nil
}

// Attempt is one send request (POST /v1/messages, or a Twilio create), as
// the fake saw and answered it.
type Attempt struct {
	Seq  int       `json:"seq"`
	Time time.Time `json:"time"`
	// API is the API the request spoke: APIGeneric or APITwilio.
	API            string `json:"api"`
	IdempotencyKey string `json:"idempotency_key"`
	To             string `json:"to"`
	From           string `json:"from,omitempty"`
	Body           string `json:"body"`
	Tenant         string `json:"tenant"`
	Reference      string `json:"reference"`
	// Status is the HTTP status answered, or that would have been answered
	// had the client waited (see ClientGone); 499 if the client left during
	// Config.Delay.
	Status int `json:"status"`
	// Duplicate is set when the key had already been accepted.
	Duplicate bool `json:"duplicate"`
	// Fault is the injected outcome ("429", "503", "timeout_after_accept",
	// ...), empty for a plain accept or an invalid request.
	Fault string `json:"fault,omitempty"`
	// Scripted is set when the outcome came from Config.Script.
	Scripted bool `json:"scripted,omitempty"`
	// MessageID is the accepted message's id, for accepts and duplicates.
	MessageID string `json:"message_id,omitempty"`
	// ClientGone is set when the client went away before the answer.
	ClientGone bool `json:"client_gone,omitempty"`
	// Error says why an invalid request was rejected.
	Error string `json:"error,omitempty"`
}

// Message is an accepted message: one per idempotency key in the generic
// API, one per accepted create in Twilio's (which does not deduplicate).
type Message struct {
	ID string `json:"id"`
	// API is the API it was sent through: APIGeneric or APITwilio.
	API            string `json:"api"`
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	To             string `json:"to"`
	Body           string `json:"body"`
	Tenant         string `json:"tenant"`
	Reference      string `json:"reference"`
	From           string `json:"from,omitempty"`
	// Service is the Twilio MessagingServiceSid it was sent with.
	Service string `json:"messaging_service_sid,omitempty"`
	// StatusCallback is the Twilio status-callback URL it was sent with.
	StatusCallback string `json:"status_callback,omitempty"`
	// Status is "accepted" (generic), or Twilio's "sent" or "undelivered".
	Status string `json:"status"`
	// ErrorCode is Twilio's delivery error code (30003), zero if none.
	ErrorCode  int       `json:"error_code,omitempty"`
	AcceptedAt time.Time `json:"accepted_at"`
	// Attempts counts every request that carried this key, before and after
	// acceptance.
	Attempts int `json:"attempts"`
}

// Stats counts what the fake has seen since it started or was reset.
type Stats struct {
	Attempts int `json:"attempts"`
	// Lookups counts fetches and lists of messages (both APIs): how often
	// a client asked whether a send had arrived.
	Lookups    int            `json:"lookups"`
	Accepted   int            `json:"accepted"`
	Duplicates int            `json:"duplicates"`
	ClientGone int            `json:"client_gone"`
	ByStatus   map[int]int    `json:"by_status"`
	ByFault    map[string]int `json:"by_fault"`
}

// Option configures a Server at construction.
type Option func(*Server)

// WithConfig sets the initial Config, Seed included. It panics if cfg is
// invalid: check it with Config.Validate first when it comes from a user.
func WithConfig(cfg Config) Option {
	if err := cfg.Validate(); err != nil {
		panic("fakesms: WithConfig: " + err.Error())
	}
	return func(s *Server) { s.cfg = cloneConfig(cfg) }
}

// WithSeed sets the generator seed; it overrides the Seed of an earlier
// WithConfig.
func WithSeed(seed uint64) Option {
	return func(s *Server) { s.cfg.Seed = seed }
}

// WithClock sets the clock that stamps records. Delay and Stall still use
// real timers. The default is clock.Real.
func WithClock(c clock.Clock) Option {
	return func(s *Server) { s.clock = c }
}

// WithToken makes the generic API (POST and GET /v1/messages) require "Authorization: Bearer <token>"
// and answer 401 otherwise. The control API stays open.
func WithToken(token string) Option {
	return func(s *Server) { s.token = token }
}

// WithAttemptHook calls fn with each attempt once it is answered (or its
// client is gone), outside the Server's lock; fn must be safe for concurrent
// use. Meant for logging.
func WithAttemptHook(fn func(Attempt)) Option {
	return func(s *Server) { s.hook = fn }
}

// Server is the fake provider. It is an http.Handler and is safe for
// concurrent use.
type Server struct {
	mux     *http.ServeMux
	clock   clock.Clock
	token   string
	hook    func(Attempt)
	release chan struct{}
	closed  sync.Once

	mu          sync.Mutex
	cfg         Config
	rng         *rand.Rand
	nextID      uint64 // never reset, so ids stay unique across Reset
	attempts    []*Attempt
	messages    []*Message
	byKey       map[string]*Message
	keyAttempts map[string]int
	lookups     int
	// twilio is the account the Twilio routes serve (WithTwilioAccount).
	twilio twilioAccount
	// callbacks tracks status callbacks in flight, so Close can wait.
	callbacks sync.WaitGroup
}

// New returns a Server with no faults unless options set them.
func New(opts ...Option) *Server {
	s := &Server{
		clock:   clock.Real{},
		release: make(chan struct{}),
	}
	for _, opt := range opts {
		opt(s)
	}
	s.rng = newRand(s.cfg.Seed)
	s.clearRecords()

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", s.handleSend)
	mux.HandleFunc("GET /v1/messages/{key}", s.handleGet)
	s.twilioRoutes(mux)
	mux.HandleFunc("GET /control", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Config())
	})
	mux.HandleFunc("PUT /control", s.handlePutControl)
	mux.HandleFunc("POST /reset", func(w http.ResponseWriter, _ *http.Request) {
		s.Reset()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /messages", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Messages())
	})
	mux.HandleFunc("GET /attempts", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Attempts())
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Stats())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux = mux
	return s
}

func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

func cloneConfig(c Config) Config {
	c.Script = slices.Clone(c.Script)
	return c
}

// ServeHTTP serves the provider API and the control API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(w, r)
}

// Close releases every handler waiting in Delay or Stall, which then answers
// at once, and makes later waits return immediately, so an http.Server
// holding stalled requests can shut down; then it waits for status callbacks
// in flight. The Server keeps serving.
func (s *Server) Close() {
	s.closed.Do(func() { close(s.release) })
	s.callbacks.Wait()
}

// Config returns the current Config; Script holds only what is left of it.
func (s *Server) Config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneConfig(s.cfg)
}

// SetConfig validates cfg, replaces the Config and reseeds the generator.
func (s *Server) SetConfig(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("setting fakesms config: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg = cloneConfig(cfg)
	s.rng = newRand(cfg.Seed)
	return nil
}

// Enqueue appends outcomes to the script.
func (s *Server) Enqueue(outcomes ...Outcome) error {
	for i, o := range outcomes {
		if err := o.Validate(); err != nil {
			return fmt.Errorf("enqueueing outcome %d: %w", i, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.Script = append(s.cfg.Script, outcomes...)
	return nil
}

// Reset clears every record and returns the Config to the zero value
// (reseeding with seed 0). Message ids keep counting up.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg = Config{}
	s.rng = newRand(0)
	s.clearRecords()
}

func (s *Server) clearRecords() {
	s.attempts = nil
	s.messages = nil
	s.byKey = make(map[string]*Message)
	s.keyAttempts = make(map[string]int)
	s.lookups = 0
}

// Messages returns the accepted messages in acceptance order.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Message, len(s.messages))
	for i, m := range s.messages {
		out[i] = *m
		out[i].Attempts = s.keyAttempts[m.IdempotencyKey]
	}
	return out
}

// Attempts returns every attempt in arrival order. An attempt still stalled
// shows the status it will answer.
func (s *Server) Attempts() []Attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Attempt, len(s.attempts))
	for i, a := range s.attempts {
		out[i] = *a
	}
	return out
}

// Stats returns the counts.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{
		Attempts: len(s.attempts),
		Accepted: len(s.messages),
		Lookups:  s.lookups,
		ByStatus: make(map[int]int),
		ByFault:  make(map[string]int),
	}
	for _, a := range s.attempts {
		st.ByStatus[a.Status]++
		if a.Duplicate {
			st.Duplicates++
		}
		if a.ClientGone {
			st.ClientGone++
		}
		if a.Fault != "" {
			st.ByFault[a.Fault]++
		}
	}
	return st
}

func (s *Server) handlePutControl(w http.ResponseWriter, r *http.Request) {
	var cfg Config
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err == nil {
		err = json.Unmarshal(body, &cfg)
	}
	if err == nil {
		err = s.SetConfig(cfg)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, s.Config())
}

// sendRequest is a valid send request, in either API.
type sendRequest struct {
	// Key is the Idempotency-Key (generic API); empty for Twilio, which
	// does not deduplicate.
	Key       string
	To        string
	Body      string
	Reference string
	Tenant    string
	From      string
	// Service is the Twilio MessagingServiceSid, when the request named one
	// instead of From.
	Service string
	// Callback is the Twilio StatusCallback URL.
	Callback string
}

// refusal is a request the fake rejects before any fault: status, the
// provider's error code (Twilio's; zero for the generic API) and why.
type refusal struct {
	status int
	code   int
	reason string
}

// dialect is what differs between the APIs the fake speaks: how a request
// is authorised and read, and how answers are written.
type dialect interface {
	// name is the API's name in the records ("generic", "twilio").
	name() string
	// key is the request's idempotency key, before its body is read.
	key(r *http.Request) string
	// parse authorises and reads a send request; a non-nil refusal rejects it.
	parse(r *http.Request, body []byte) (sendRequest, *refusal)
	// accepted writes the answer to an accepted (dup: deduplicated) send.
	accepted(w http.ResponseWriter, m *Message, dup bool)
	// failed writes an error answer (an injected fault or a refusal).
	failed(w http.ResponseWriter, f refusal, retryAfter int)
}

// decision is an outcome with the Config it was decided under.
type decision struct {
	outcome    Outcome
	scripted   bool
	stall      time.Duration
	retryAfter int
}

// handleSend serves POST /v1/messages, the generic API.
func (s *Server) handleSend(w http.ResponseWriter, r *http.Request) {
	s.serveSend(w, r, generic{token: s.token})
}

// serveSend runs one send request through validation, the delay and the
// fault plan, in the dialect of its API.
func (s *Server) serveSend(w http.ResponseWriter, r *http.Request, d dialect) {
	key := d.key(r)
	a := s.begin(d.name(), key)
	// Read the body to EOF: only then does net/http watch the connection
	// and cancel the request context when the client goes away, which the
	// stalls rely on.
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err != nil {
		s.reject(w, a, d, refusal{status: http.StatusBadRequest, reason: "reading the body: " + err.Error()})
		return
	}
	req, bad := d.parse(r, body)
	s.update(a, func(a *Attempt) {
		a.To, a.Body, a.Tenant, a.Reference, a.From = req.To, req.Body, req.Tenant, req.Reference, req.From
	})
	if bad != nil {
		s.reject(w, a, d, *bad)
		return
	}

	if delay := s.Config().Delay; delay > 0 && !s.wait(r, delay) {
		s.finish(a, func(a *Attempt) { a.Status, a.ClientGone = statusClientGone, true })
		return
	}

	dec := s.decide()
	fault := string(dec.outcome)
	if dec.outcome == Accept {
		fault = ""
	}
	s.update(a, func(a *Attempt) { a.Fault, a.Scripted = fault, dec.scripted })

	switch dec.outcome {
	case Accept, AcceptUndelivered:
		m, dup := s.accept(a, d.name(), req, dec.outcome == AcceptUndelivered)
		s.finish(a, nil)
		d.accepted(w, m, dup)
		s.callBack(m, dup)
	case TimeoutAfterAccept:
		m, dup := s.accept(a, d.name(), req, false)
		s.callBack(m, dup)
		if !s.stall(r, a, dec.stall) {
			return
		}
		s.finish(a, nil)
		d.accepted(w, m, dup)
	case Timeout:
		s.update(a, func(a *Attempt) { a.Status = http.StatusGatewayTimeout })
		if !s.stall(r, a, dec.stall) {
			return
		}
		s.finish(a, nil)
		d.failed(w, refusal{status: http.StatusGatewayTimeout, reason: "upstream timeout (injected)"}, 0)
	default:
		status := dec.outcome.status()
		s.finish(a, func(a *Attempt) { a.Status = status })
		retryAfter := 0
		if status == http.StatusTooManyRequests {
			retryAfter = dec.retryAfter
		}
		d.failed(w, refusal{status: status, reason: http.StatusText(status) + " (injected)"}, retryAfter)
	}
}

// generic is the provider API sms.Client speaks: JSON, a bearer token, an
// Idempotency-Key it deduplicates on.
type generic struct{ token string }

func (generic) name() string { return APIGeneric }

func (generic) key(r *http.Request) string { return r.Header.Get("Idempotency-Key") }

// genericRequest is the generic API's request body.
type genericRequest struct {
	To        string `json:"to"`
	Body      string `json:"body"`
	Reference string `json:"reference"`
	Tenant    string `json:"tenant"`
	From      string `json:"from"`
}

// decodePlain decodes body as json.Unmarshal would when it is a plain
// object: members named exactly as the fields, each a string without
// escapes or control characters in valid UTF-8, between any JSON
// whitespace. It reports false, leaving r partly set, for anything else
// (other names or cases, escapes, null, nesting, trailing data), which
// json.Unmarshal then decodes, or refuses with its own message.
func (r *genericRequest) decodePlain(body []byte) bool {
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	i = skipWS(body, i+1)
	if i < len(body) && body[i] == '}' {
		return skipWS(body, i+1) == len(body)
	}
	for {
		name, next, ok := plainString(body, i)
		if !ok {
			return false
		}
		i = skipWS(body, next)
		if i >= len(body) || body[i] != ':' {
			return false
		}
		value, next, ok := plainString(body, skipWS(body, i+1))
		if !ok || !utf8.Valid(value) {
			return false
		}
		switch string(name) {
		case "to":
			r.To = string(value)
		case "body":
			r.Body = string(value)
		case "reference":
			r.Reference = string(value)
		case "tenant":
			r.Tenant = string(value)
		case "from":
			r.From = string(value)
		default:
			return false
		}
		i = skipWS(body, next)
		if i >= len(body) {
			return false
		}
		switch body[i] {
		case ',':
			i = skipWS(body, i+1)
		case '}':
			return skipWS(body, i+1) == len(body)
		default:
			return false
		}
	}
}

// plainString reads the JSON string at b[i] when it has no escape or
// control character, returning its contents and the index after it.
func plainString(b []byte, i int) ([]byte, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// skipWS returns the index of the first byte at or after i that is not JSON
// whitespace.
func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func (g generic) parse(r *http.Request, body []byte) (sendRequest, *refusal) {
	if g.token != "" && r.Header.Get("Authorization") != "Bearer "+g.token {
		return sendRequest{}, &refusal{status: http.StatusUnauthorized, reason: "missing or wrong bearer token"}
	}
	key := g.key(r)
	if key == "" {
		return sendRequest{}, &refusal{status: http.StatusBadRequest, reason: "missing Idempotency-Key header"}
	}
	var req genericRequest
	if !req.decodePlain(body) {
		req = genericRequest{}
		if err := json.Unmarshal(body, &req); err != nil {
			return sendRequest{}, &refusal{status: http.StatusBadRequest, reason: "invalid JSON body: " + err.Error()}
		}
	}
	out := sendRequest{Key: key, To: req.To, Body: req.Body, Reference: req.Reference, Tenant: req.Tenant, From: req.From}
	if req.To == "" || req.Body == "" {
		return out, &refusal{status: http.StatusBadRequest, reason: `"to" and "body" are required`}
	}
	return out, nil
}

// accepted writes {"id":…,"status":"accepted"} (201), or with
// "duplicate":true first (200): what json.Marshal writes for the map of
// those keys (sorted, HTML-escaped), appended by hand since this is the
// answer to nearly every send (TestAcceptedAnswerAsMarshal).
func (generic) accepted(w http.ResponseWriter, m *Message, dup bool) {
	status := http.StatusCreated
	b := make([]byte, 0, 80)
	b = append(b, '{')
	if dup {
		status = http.StatusOK
		b = append(b, `"duplicate":true,`...)
	}
	b = append(b, `"id":`...)
	b = appendJSONString(b, m.ID)
	b = append(b, `,"status":"accepted"}`+"\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// appendJSONString appends v as encoding/json writes a string: quoted,
// with HTML-sensitive and control characters escaped. Ids are plain ASCII,
// so only those are appended by hand; anything else goes through
// json.Marshal.
func appendJSONString(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(v)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, v...)
	return append(b, '"')
}

func (generic) failed(w http.ResponseWriter, f refusal, retryAfter int) {
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	writeError(w, f.status, f.reason)
}

// handleGet serves GET /v1/messages/{key}: the message accepted under an
// idempotency key, or 404.
func (s *Server) handleGet(w http.ResponseWriter, r *http.Request) {
	if s.token != "" && r.Header.Get("Authorization") != "Bearer "+s.token {
		writeError(w, http.StatusUnauthorized, "missing or wrong bearer token")
		return
	}
	s.mu.Lock()
	s.lookups++
	m, ok := s.byKey[r.PathValue("key")]
	var out Message
	if ok {
		out = *m
	}
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "no message with that idempotency key")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": out.ID, "status": out.Status, "to": out.To,
		"reference": out.Reference, "accepted_at": out.AcceptedAt})
}

// begin records a new attempt.
func (s *Server) begin(api, key string) *Attempt {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	a := &Attempt{Seq: len(s.attempts) + 1, Time: now, API: api, IdempotencyKey: key}
	s.attempts = append(s.attempts, a)
	if key != "" {
		s.keyAttempts[key]++
	}
	return a
}

func (s *Server) update(a *Attempt, fn func(*Attempt)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fn(a)
}

// finish applies fn (if any) and hands a copy of the attempt to the hook.
func (s *Server) finish(a *Attempt, fn func(*Attempt)) {
	s.mu.Lock()
	if fn != nil {
		fn(a)
	}
	done := *a
	s.mu.Unlock()
	if s.hook != nil {
		s.hook(done)
	}
}

func (s *Server) reject(w http.ResponseWriter, a *Attempt, d dialect, f refusal) {
	s.finish(a, func(a *Attempt) { a.Status, a.Error = f.status, f.reason })
	d.failed(w, f, 0)
}

// decide pops the script or draws from the generator.
func (s *Server) decide() decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.cfg
	d := decision{stall: c.Stall, retryAfter: c.RetryAfterSeconds}
	if len(c.Script) > 0 {
		d.outcome, d.scripted = c.Script[0], true
		c.Script = c.Script[1:]
		return d
	}
	x := s.rng.Float64()
	switch {
	case x < c.Rate429:
		d.outcome = Outcome(strconv.Itoa(http.StatusTooManyRequests))
	case x < c.Rate429+c.Rate5xx:
		d.outcome = Outcome(strconv.Itoa(status5xx))
	case x < c.Rate429+c.Rate5xx+c.Rate4xx:
		d.outcome = Outcome(strconv.Itoa(status4xx))
	case x < c.Rate429+c.Rate5xx+c.Rate4xx+c.RateTimeoutAfterAccept:
		d.outcome = TimeoutAfterAccept
	default:
		d.outcome = Accept
	}
	return d
}

// accept creates the message for the request's key, or finds the one
// already accepted (the generic API deduplicates; a Twilio request has no
// key and always creates one). The check and the insert share one critical
// section, so concurrent requests with one key create one message.
// undelivered marks it as one the carrier will refuse (Twilio 30003).
func (s *Server) accept(a *Attempt, api string, req sendRequest, undelivered bool) (*Message, bool) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	m, dup := s.byKey[req.Key]
	if req.Key == "" {
		dup = false
	}
	if !dup {
		s.nextID++
		m = &Message{
			ID:             fmt.Sprintf("sms_%06d", s.nextID),
			API:            api,
			IdempotencyKey: req.Key,
			To:             req.To,
			Body:           req.Body,
			Tenant:         req.Tenant,
			Reference:      req.Reference,
			From:           req.From,
			Service:        req.Service,
			StatusCallback: req.Callback,
			Status:         "accepted",
			AcceptedAt:     now,
		}
		if api == APITwilio {
			m.ID = twilioSID("SM", s.nextID)
			m.Status = "sent"
			if undelivered {
				m.Status, m.ErrorCode = "undelivered", undeliveredCode
			}
		}
		if req.Key != "" {
			s.byKey[req.Key] = m
		}
		s.messages = append(s.messages, m)
	}
	a.MessageID, a.Duplicate = m.ID, dup
	a.Status = http.StatusCreated
	if dup {
		a.Status = http.StatusOK
	}
	return m, dup
}

// stall waits for d (forever when zero) and reports whether the client is
// still there; if not, the attempt is finished as ClientGone.
func (s *Server) stall(r *http.Request, a *Attempt, d time.Duration) bool {
	if d == 0 {
		d = math.MaxInt64
	}
	if s.wait(r, d) {
		return true
	}
	s.finish(a, func(a *Attempt) { a.ClientGone = true })
	return false
}

// wait sleeps for d and reports whether the request is still live. Close
// cuts the sleep short.
func (s *Server) wait(r *http.Request, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.release:
		return r.Context().Err() == nil
	case <-r.Context().Done():
		return false
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": msg, "status": status})
}
