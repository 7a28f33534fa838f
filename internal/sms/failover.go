package sms

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// This file is provider failover. A channel may list several providers in
// order; the whole fleet sends through one of them at a time, chosen in
// PostgreSQL (provider_failover, schema version 19) and never per process,
// so four replicas move together and a reminder is not split between
// providers by whichever replica holds it. Each worker reports every send's
// result to the shared row; after After consecutive retryable failures, or
// an error rate of ErrorRate over Window, the fleet moves to the next
// provider. While it is away from the first provider, one worker of the
// fleet at a time (every ProbeEvery) sends its next message to the first
// as a probe; success brings the fleet back.
//
// Each attempt records the provider its request goes to
// (delivery_attempts.provider, schema version 24): the worker records the
// fleet's choice (Current) when it claims the attempt, and Send, before the
// request leaves for another provider (a probe, or a switch since the claim),
// records that one first (provider.Message.Route). An attempt whose outcome
// is unknown is then looked up at its provider only, before the worker may
// send again, wherever the fleet has moved since: a reminder never goes to
// the second provider before the first has been checked, and one whose
// provider cannot answer waits (its retry) until it can. An attempt with no
// provider recorded (from before version 24) is looked up at every
// provider, in order.

// Failover defaults, for the zero values of FailoverConfig.
const (
	DefaultFailoverAfter  = 5
	DefaultFailoverWindow = 30 * time.Second
	DefaultFailoverMin    = 20
	DefaultFailoverProbe  = 30 * time.Second
	DefaultFailoverCache  = time.Second
	// reportTimeout bounds the statement that reports a send's result,
	// which runs even when the send's own context has ended.
	reportTimeout = 5 * time.Second
)

// FailoverConfig says when the fleet leaves a provider and when it tries
// the first one again.
type FailoverConfig struct {
	// Channel keys the shared row ("sms"). Empty: "sms".
	Channel string
	// After is the number of consecutive retryable failures (5xx, 429,
	// timeouts) at the current provider that move the fleet to the next.
	// Zero: DefaultFailoverAfter.
	After int
	// ErrorRate, in (0, 1], moves the fleet when that share of the sends in
	// the window failed retryably, once the window holds MinSends sends.
	// Zero: no error-rate rule.
	ErrorRate float64
	// Window is the error-rate window. Zero: DefaultFailoverWindow.
	Window time.Duration
	// MinSends is how many sends the window needs before ErrorRate applies.
	// Zero: DefaultFailoverMin.
	MinSends int
	// ProbeEvery is how often, away from the first provider, one worker
	// sends through the first as a probe. Zero: DefaultFailoverProbe.
	ProbeEvery time.Duration
	// Cache is how long a worker trusts its last read of the shared choice.
	// Zero: DefaultFailoverCache.
	Cache time.Duration
}

// WithDefaults fills the zero values.
func (c FailoverConfig) WithDefaults() FailoverConfig {
	if c.Channel == "" {
		c.Channel = string(reminder.SMS)
	}
	if c.After <= 0 {
		c.After = DefaultFailoverAfter
	}
	if c.Window <= 0 {
		c.Window = DefaultFailoverWindow
	}
	if c.MinSends <= 0 {
		c.MinSends = DefaultFailoverMin
	}
	if c.ProbeEvery <= 0 {
		c.ProbeEvery = DefaultFailoverProbe
	}
	if c.Cache <= 0 {
		c.Cache = DefaultFailoverCache
	}
	return c
}

// Validate rejects operator input that cannot work.
func (c FailoverConfig) Validate() error {
	if c.After < 0 || c.MinSends < 0 || c.Window < 0 || c.ProbeEvery < 0 || c.Cache < 0 {
		return fmt.Errorf("%w: failover counts and durations must not be negative", ErrInvalidConfig)
	}
	if c.ErrorRate < 0 || c.ErrorRate > 1 {
		return fmt.Errorf("%w: the failover error rate must be in [0, 1], got %v", ErrInvalidConfig, c.ErrorRate)
	}
	return nil
}

// Trips reports whether the counts of the current provider move the fleet
// to the next one.
func (c FailoverConfig) Trips(n store.FailoverCounts) bool {
	if n.Failures >= c.After {
		return true
	}
	return c.ErrorRate > 0 && n.Sends >= c.MinSends && float64(n.Failed) >= c.ErrorRate*float64(n.Sends)
}

// judge says whether a send's result counts for failover (counted), and as
// a retryable failure (failed). A permanent answer is about the message, a
// refused gate or a send canceled by shutdown never reached the provider:
// neither says anything about the provider's health.
func judge(err error) (counted, failed bool) {
	if err == nil {
		return true, false
	}
	if errors.Is(err, context.Canceled) {
		return false, false
	}
	switch provider.Classify(err).Outcome() {
	case reminder.OutcomeRetryable, reminder.OutcomeUnknown:
		return true, true
	}
	return false, false
}

// Named is one provider of a failover list.
type Named struct {
	Name   string
	Looker provider.Looker
}

// Shared is the fleet's shared provider choice (*store.Store).
type Shared interface {
	FailoverCurrent(ctx context.Context, channel, first string, now time.Time) (string, time.Time, error)
	FailoverCount(ctx context.Context, channel, provider string, successes int, failed bool, now time.Time, window time.Duration) (store.FailoverCounts, bool, error)
	FailoverSwitch(ctx context.Context, channel, from, to string, now, probeAt time.Time) (bool, error)
	FailoverClaimProbe(ctx context.Context, channel, first string, now, next time.Time) (bool, error)
}

// Failover is a provider.Looker over an ordered list of providers, sending
// through the one the fleet has chosen. Share must be called before the
// first Send.
type Failover struct {
	cfg       FailoverConfig
	providers []Named

	shared   Shared
	clock    clock.Clock
	log      zerolog.Logger
	inUse    *prometheus.GaugeVec
	switches *prometheus.CounterVec

	mu      sync.Mutex
	cur     string    // the shared choice as last read
	probeAt time.Time // its next probe, zero on the first provider
	readAt  time.Time // when cur was read; zero: read again
	// pending counts the successes not yet reported, by provider, since
	// flushedAt: they are reported together (see report).
	pending   map[string]int
	flushedAt time.Time
}

// maxPendingSuccesses bounds the successes a worker holds back before it
// reports them.
const maxPendingSuccesses = 100

// ErrNoShared means a Failover was used before Share.
var ErrNoShared = errors.New("provider failover has no shared state")

// NewFailover returns a Failover over providers, in order of preference.
func NewFailover(cfg FailoverConfig, providers []Named) (*Failover, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(providers) == 0 {
		return nil, fmt.Errorf("%w: failover needs at least one provider", ErrInvalidConfig)
	}
	for i, p := range providers {
		if p.Name == "" || p.Looker == nil || slices.ContainsFunc(providers[:i], func(q Named) bool { return q.Name == p.Name }) {
			return nil, fmt.Errorf("%w: failover providers need distinct names and adapters", ErrInvalidConfig)
		}
	}
	return &Failover{cfg: cfg.WithDefaults(), providers: providers, clock: clock.Real{}, log: zerolog.Nop()}, nil
}

// Share gives the Failover the fleet's shared choice, its clock and logger,
// and registers its metrics on reg (nil: none):
// nudge_sms_provider_in_use{provider} (1 for the provider this worker last
// read as the fleet's) and nudge_sms_provider_switches_total{from,to} (the
// switches this worker made).
func (f *Failover) Share(s Shared, clk clock.Clock, log zerolog.Logger, reg prometheus.Registerer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shared, f.clock, f.log = s, clk, log
	f.inUse = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nudge_sms_provider_in_use",
		Help: "1 for the SMS provider the fleet sends through, as this worker last read it (provider failover).",
	}, []string{"provider"})
	f.switches = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "nudge_sms_provider_switches_total",
		Help: "Switches of the fleet's SMS provider this worker made (provider failover).",
	}, []string{"from", "to"})
	if reg != nil {
		reg.MustRegister(f.inUse, f.switches)
	}
}

// setInUse exports cur as the provider in use; f.mu is held.
func (f *Failover) setInUse(cur string) {
	for _, p := range f.providers {
		v := 0.0
		if p.Name == cur {
			v = 1
		}
		f.inUse.WithLabelValues(p.Name).Set(v)
	}
}

// Providers returns the provider names in order of preference.
func (f *Failover) Providers() []string {
	names := make([]string, len(f.providers))
	for i, p := range f.providers {
		names[i] = p.Name
	}
	return names
}

// Current returns the provider the fleet sends through as this worker last
// read it (the first provider before any read), without a round trip: the
// rate limiter takes that provider's limits (ratelimit.Limiter.UseProviders).
func (f *Failover) Current() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cur == "" {
		return f.first()
	}
	return f.cur
}

func (f *Failover) first() string { return f.providers[0].Name }

// get returns the named provider, or the first when the name is not in the
// list (a row left by a deploy with another list).
func (f *Failover) get(name string) Named {
	if i := slices.IndexFunc(f.providers, func(p Named) bool { return p.Name == name }); i >= 0 {
		return f.providers[i]
	}
	return f.providers[0]
}

// next returns the provider after name, wrapping to the first.
func (f *Failover) next(name string) string {
	i := slices.IndexFunc(f.providers, func(p Named) bool { return p.Name == name })
	return f.providers[(i+1)%len(f.providers)].Name
}

// current returns the fleet's provider, read again when the cached read is
// older than Cache, and whether its probe of the first provider is due. On
// a read error the last read stands (the first provider before any).
func (f *Failover) current(ctx context.Context, now time.Time) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.shared == nil {
		return "", false, ErrNoShared
	}
	if f.readAt.IsZero() || now.Sub(f.readAt) >= f.cfg.Cache {
		cur, probeAt, err := f.shared.FailoverCurrent(ctx, f.cfg.Channel, f.first(), now)
		if err != nil {
			f.log.Warn().Err(err).Str("provider", f.cur).Msg("provider failover: keeping the last known provider")
		} else {
			f.cur, f.probeAt, f.readAt = f.get(cur).Name, probeAt, now
			f.setInUse(f.cur)
		}
	}
	if f.cur == "" {
		f.cur = f.first()
	}
	return f.cur, f.cur != f.first() && !f.probeAt.IsZero() && !now.Before(f.probeAt), nil
}

// remember records a choice this worker made or learnt.
func (f *Failover) remember(cur string, probeAt, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cur, f.probeAt, f.readAt = cur, probeAt, now
	f.setInUse(cur)
}

// forget makes the next Send read the shared choice again.
func (f *Failover) forget() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readAt = time.Time{}
}

// Send sends msg through the fleet's provider, or through the first one as
// the fleet's probe when it is this worker's turn, and reports the result.
func (f *Failover) Send(ctx context.Context, msg provider.Message) (string, error) {
	now := f.clock.Now()
	cur, probeDue, err := f.current(ctx, now)
	if err != nil {
		return "", provider.RetryableError(provider.CodeNotStarted, 0, err)
	}
	if probeDue {
		if id, done, err := f.probe(ctx, msg, cur, now); done {
			return id, err
		}
	}
	if err := route(&msg, cur); err != nil {
		return "", err
	}
	id, err := f.get(cur).Looker.Send(ctx, msg)
	f.report(ctx, cur, err)
	return id, err
}

// route records, through msg.Route, that msg goes to name when its attempt
// is recorded as going elsewhere: an error means it must not be sent.
func route(msg *provider.Message, name string) error {
	if msg.Route == nil || msg.Provider == name {
		return nil
	}
	if err := msg.Route(name); err != nil {
		return provider.RetryableError(provider.CodeNotStarted, 0,
			fmt.Errorf("reminder %d not sent: recording its provider %s: %w", msg.ReminderID, name, err))
	}
	msg.Provider = name
	return nil
}

// probe tries the first provider with msg when this worker wins the fleet's
// due probe. done is false when msg is still to be sent through cur: the
// probe was not this worker's, or the first provider refused msg with a
// known answer (it does not hold it). A success brings the fleet back; an
// unknown outcome ends the send, since the first provider may hold msg.
func (f *Failover) probe(ctx context.Context, msg provider.Message, cur string, now time.Time) (id string, done bool, err error) {
	first := f.first()
	won, err := f.shared.FailoverClaimProbe(ctx, f.cfg.Channel, first, now, now.Add(f.cfg.ProbeEvery))
	if err != nil || !won {
		// Another worker probed, or the fleet is back on the first
		// provider: this worker's read is stale.
		f.forget()
		return "", false, nil
	}
	if err := route(&msg, first); err != nil {
		return "", true, err
	}
	id, err = f.get(first).Looker.Send(ctx, msg)
	if err == nil {
		f.move(ctx, cur, first)
		return id, true, nil
	}
	pe := provider.Classify(err)
	f.log.Info().Str("provider", first).Str("code", pe.Code).Msg("provider failover: the probe of the first provider failed")
	if pe.Outcome() != reminder.OutcomeRetryable {
		return id, true, err
	}
	return "", false, nil
}

// report counts a send's result against name and moves the fleet on when
// the counts trip the policy. Successes are not written one by one: every
// send of the fleet would update the channel's one shared row, and those
// updates queue on its row lock. A worker holds its successes back and
// reports them in one statement at most every Cache (or every
// maxPendingSuccesses), and at once with its next failure, before it, so a
// success still breaks a run of failures. What this costs: another worker's
// success may reach the row up to Cache late, so a run of failures
// elsewhere can trip while it waits, and the error-rate window may miss a
// second of successes at its edge; what it saves is the row lock on the
// path of every send (BenchmarkFailoverSends).
func (f *Failover) report(ctx context.Context, name string, sendErr error) {
	counted, failed := judge(sendErr)
	if !counted {
		return
	}
	now := f.clock.Now()
	f.mu.Lock()
	if f.pending == nil {
		f.pending = map[string]int{}
	}
	if !failed {
		f.pending[name]++
		if f.pending[name] < maxPendingSuccesses && now.Sub(f.flushedAt) < f.cfg.Cache {
			f.mu.Unlock()
			return
		}
	}
	successes := f.pending[name]
	delete(f.pending, name)
	f.flushedAt = now
	f.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
	defer cancel()
	n, ok, err := f.shared.FailoverCount(ctx, f.cfg.Channel, name, successes, failed, now, f.cfg.Window)
	if err != nil {
		f.log.Warn().Err(err).Int("successes", successes).Bool("failed", failed).
			Msg("provider failover: send results were not counted")
		return
	}
	if !ok {
		f.forget() // the fleet moved on
		return
	}
	if failed && f.cfg.Trips(n) {
		f.move(ctx, name, f.next(name))
	}
}

// move switches the fleet from one provider to another, if it is still on
// the first, and remembers the choice.
func (f *Failover) move(ctx context.Context, from, to string) {
	now := f.clock.Now()
	var probeAt time.Time
	if to != f.first() {
		probeAt = now.Add(f.cfg.ProbeEvery)
	}
	ok, err := f.shared.FailoverSwitch(ctx, f.cfg.Channel, from, to, now, probeAt)
	if err != nil {
		f.log.Warn().Err(err).Str("from", from).Str("to", to).Msg("provider failover: the switch was not recorded")
		return
	}
	if !ok {
		f.forget()
		return
	}
	f.remember(to, probeAt, now)
	f.switches.WithLabelValues(from, to).Inc()
	f.log.Warn().Str("from", from).Str("to", to).Msg("provider failover: the fleet now sends through " + to)
}

// Lookup asks the providers msg.Earlier went to, in order, for a message of
// those attempts: each attempt only at its own provider (every provider for
// one with none recorded). Found at one, it returns that one's id; a
// provider that cannot answer ends the search with its error (nothing may
// be sent before it can); ErrNotFound only when none holds it. A provider
// none of the attempts went to is not asked (with no attempts named, every
// provider is).
func (f *Failover) Lookup(ctx context.Context, msg provider.Message) (string, error) {
	var asked []string
	for _, p := range f.providers {
		q := msg
		q.Earlier = nil
		for _, e := range msg.Earlier {
			if e.Provider == "" || e.Provider == p.Name || !f.has(e.Provider) {
				q.Earlier = append(q.Earlier, e)
			}
		}
		if len(q.Earlier) == 0 && len(msg.Earlier) > 0 {
			continue
		}
		asked = append(asked, p.Name)
		id, err := p.Looker.Lookup(ctx, q)
		if err == nil {
			return id, nil
		}
		if !errors.Is(err, provider.ErrNotFound) {
			return "", fmt.Errorf("looking up at provider %s: %w", p.Name, err)
		}
	}
	return "", fmt.Errorf("reminder %d at %v: %w", msg.ReminderID, asked, provider.ErrNotFound)
}

// has reports whether name is one of the providers: an attempt recorded at
// a provider this deploy no longer lists is looked up at every one.
func (f *Failover) has(name string) bool {
	return slices.ContainsFunc(f.providers, func(p Named) bool { return p.Name == name })
}
