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
// Routes:
//
//	POST /v1/messages   send (the provider API sms.Client speaks)
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
	// Timeout stalls like TimeoutAfterAccept without accepting, then answers
	// 504.
	Timeout Outcome = "timeout"
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
	case Accept, TimeoutAfterAccept, Timeout:
		return nil
	}
	if code, err := strconv.Atoi(string(o)); err == nil && code >= 400 && code <= 599 && len(o) == 3 {
		return nil
	}
	return fmt.Errorf("unknown outcome %q: want accept, timeout_after_accept, timeout or a status 400-599", string(o))
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

// Attempt is one request to POST /v1/messages, as the fake saw and answered it.
type Attempt struct {
	Seq            int       `json:"seq"`
	Time           time.Time `json:"time"`
	IdempotencyKey string    `json:"idempotency_key"`
	To             string    `json:"to"`
	Body           string    `json:"body"`
	Tenant         string    `json:"tenant"`
	Reference      string    `json:"reference"`
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

// Message is an accepted message: one per idempotency key.
type Message struct {
	ID             string    `json:"id"`
	IdempotencyKey string    `json:"idempotency_key"`
	To             string    `json:"to"`
	Body           string    `json:"body"`
	Tenant         string    `json:"tenant"`
	Reference      string    `json:"reference"`
	From           string    `json:"from,omitempty"`
	AcceptedAt     time.Time `json:"accepted_at"`
	// Attempts counts every request that carried this key, before and after
	// acceptance.
	Attempts int `json:"attempts"`
}

// Stats counts what the fake has seen since it started or was reset.
type Stats struct {
	Attempts   int            `json:"attempts"`
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

// WithToken makes POST /v1/messages require "Authorization: Bearer <token>"
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
// holding stalled requests can shut down. The Server keeps serving.
func (s *Server) Close() {
	s.closed.Do(func() { close(s.release) })
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

// sendRequest is the provider API's request body.
type sendRequest struct {
	To        string `json:"to"`
	Body      string `json:"body"`
	Reference string `json:"reference"`
	Tenant    string `json:"tenant"`
	From      string `json:"from"`
}

// decision is an outcome with the Config it was decided under.
type decision struct {
	outcome    Outcome
	scripted   bool
	stall      time.Duration
	retryAfter int
}

func (s *Server) handleSend(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	a := s.begin(key)

	if s.token != "" && r.Header.Get("Authorization") != "Bearer "+s.token {
		s.reject(w, a, http.StatusUnauthorized, "missing or wrong bearer token")
		return
	}
	if key == "" {
		s.reject(w, a, http.StatusBadRequest, "missing Idempotency-Key header")
		return
	}
	// Read the body to EOF: only then does net/http watch the connection
	// and cancel the request context when the client goes away, which the
	// stalls rely on.
	var req sendRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		s.reject(w, a, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return
	}
	s.update(a, func(a *Attempt) {
		a.To, a.Body, a.Tenant, a.Reference = req.To, req.Body, req.Tenant, req.Reference
	})
	if req.To == "" || req.Body == "" {
		s.reject(w, a, http.StatusBadRequest, `"to" and "body" are required`)
		return
	}

	if delay := s.Config().Delay; delay > 0 && !s.wait(r, delay) {
		s.finish(a, func(a *Attempt) { a.Status, a.ClientGone = statusClientGone, true })
		return
	}

	d := s.decide()
	fault := string(d.outcome)
	if d.outcome == Accept {
		fault = ""
	}
	s.update(a, func(a *Attempt) { a.Fault, a.Scripted = fault, d.scripted })

	switch d.outcome {
	case Accept:
		m, dup := s.accept(a, key, req)
		s.answerAccepted(w, a, m, dup)
	case TimeoutAfterAccept:
		m, dup := s.accept(a, key, req)
		if !s.stall(r, a, d.stall) {
			return
		}
		s.answerAccepted(w, a, m, dup)
	case Timeout:
		s.update(a, func(a *Attempt) { a.Status = http.StatusGatewayTimeout })
		if !s.stall(r, a, d.stall) {
			return
		}
		s.finish(a, nil)
		writeError(w, http.StatusGatewayTimeout, "upstream timeout (injected)")
	default:
		status := d.outcome.status()
		s.finish(a, func(a *Attempt) { a.Status = status })
		if status == http.StatusTooManyRequests && d.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(d.retryAfter))
		}
		writeError(w, status, http.StatusText(status)+" (injected)")
	}
}

// begin records a new attempt.
func (s *Server) begin(key string) *Attempt {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	a := &Attempt{Seq: len(s.attempts) + 1, Time: now, IdempotencyKey: key}
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

func (s *Server) reject(w http.ResponseWriter, a *Attempt, status int, reason string) {
	s.finish(a, func(a *Attempt) { a.Status, a.Error = status, reason })
	writeError(w, status, reason)
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

// accept creates the message for key, or finds the one already accepted.
// The check and the insert share one critical section, so concurrent
// requests with one key create one message.
func (s *Server) accept(a *Attempt, key string, req sendRequest) (*Message, bool) {
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	m, dup := s.byKey[key]
	if !dup {
		s.nextID++
		m = &Message{
			ID:             fmt.Sprintf("sms_%06d", s.nextID),
			IdempotencyKey: key,
			To:             req.To,
			Body:           req.Body,
			Tenant:         req.Tenant,
			Reference:      req.Reference,
			From:           req.From,
			AcceptedAt:     now,
		}
		s.byKey[key] = m
		s.messages = append(s.messages, m)
	}
	a.MessageID, a.Duplicate = m.ID, dup
	a.Status = http.StatusCreated
	if dup {
		a.Status = http.StatusOK
	}
	return m, dup
}

func (s *Server) answerAccepted(w http.ResponseWriter, a *Attempt, m *Message, dup bool) {
	s.finish(a, nil)
	if dup {
		writeJSON(w, http.StatusOK, map[string]any{"id": m.ID, "status": "accepted", "duplicate": true})
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"id": m.ID, "status": "accepted"})
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
