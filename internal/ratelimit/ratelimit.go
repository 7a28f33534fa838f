// Package ratelimit enforces provider and tenant capacity across the whole
// fleet. A limit that each replica enforced alone would break the moment the
// Deployment scales, so the state lives in PostgreSQL and a worker reserves
// the slots for a tenant's part of a batch in one round trip
// (nudge_rate_reserve, migration 0006).
//
// An account's capacity is handed out as send slots in time order (GCRA), at
// most Horizon ahead; the worker sends each granted message at its slot, so
// what the provider sees is paced, not bunched. Each flow (a channel's tenant)
// may take only its max-min fair share of the account among the flows that
// asked recently, capped by its own limit: a tenant with a large backlog
// cannot crowd out a small one. A message that gets no slot is not waited
// for: the worker hands it back through the retry tiers until its turn (new
// messages queue behind the flow's earlier deferred ones), or expires it as
// rate_limited when its turn is at or past its deadline.
//
// Accuracy: slots never exceed rate × window + burst in any window. A send
// reaches the provider at its slot or later (never earlier): late by the claim
// statement for a slot that was due at once, or by a busy CPU. The account
// keeps rate × Headroom tokens of its burst back for that. Slots granted for
// sends that then fail are not returned: under failures the observed rate is
// below the limit, never above.
package ratelimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Limit is a rate (tokens per second) and a burst (tokens available at once).
type Limit struct {
	Rate  float64 `json:"rate"`
	Burst int     `json:"burst"`
}

// ChannelLimits are the limits of one channel.
type ChannelLimits struct {
	// Account names the provider account whose limit this is; replicas of
	// different channels that share an account share its key.
	Account string `json:"account"`
	Limit
	// Tenants maps a tenant to its own allowance on this channel; "default"
	// applies to tenants not named. No entry and no default: tenants are
	// limited only by the account.
	Tenants map[string]Limit `json:"tenants"`
	// Providers maps a provider of the channel's failover list (sms-worker
	// --sms-providers: "twilio", "generic") to its own account and limit,
	// used while the fleet sends through it; a provider not named uses the
	// channel's. Optional: a file without it means what it meant before.
	Providers map[string]ProviderLimits `json:"providers,omitempty"`
	// Hosts (webhook only) maps a target host (as in its URL, lower case)
	// to its own limit: each host listed is an account of its own,
	// "<account>/<host>", shared by every tenant sending to it and by the
	// whole fleet, so one slow application does not slow requests to
	// another. "default" gives every host not listed such an account of
	// its own with that limit; without it, unlisted hosts share the
	// channel's account and limit. Optional.
	Hosts map[string]Limit `json:"hosts,omitempty"`
}

// ProviderLimits are one provider's account and limit.
type ProviderLimits struct {
	Account string `json:"account"`
	Limit
}

// Config is a versioned limits file.
type Config struct {
	// Version is logged and exported, so an operator can tell which file is active.
	Version  string                   `json:"version"`
	Channels map[string]ChannelLimits `json:"channels"`
}

// Parse decodes and validates a limits file, naming the offending key.
func Parse(data []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("rate limits: %w", err)
	}
	return c, c.Validate()
}

// Load reads and parses the limits file at path; "" means no limits.
func Load(path string) (Config, error) {
	if path == "" {
		return Config{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("rate limits: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func (l Limit) validate(key string) error {
	if !(l.Rate > 0) || math.IsInf(l.Rate, 0) {
		return fmt.Errorf("rate limits: %s.rate must be a positive number of sends per second", key)
	}
	if l.Burst < 1 {
		return fmt.Errorf("rate limits: %s.burst must be at least 1", key)
	}
	return nil
}

// Validate reports the first invalid key.
func (c Config) Validate() error {
	if strings.TrimSpace(c.Version) == "" && len(c.Channels) > 0 {
		return errors.New("rate limits: version is required")
	}
	for ch, cl := range c.Channels {
		if !reminder.Channel(ch).Valid() {
			return fmt.Errorf("rate limits: channels.%s: channel must be email, sms or webhook", ch)
		}
		prefix := "channels." + ch
		if cl.Account == "" {
			return fmt.Errorf("rate limits: %s.account is required", prefix)
		}
		if err := cl.Limit.validate(prefix); err != nil {
			return err
		}
		for t, l := range cl.Tenants {
			if err := l.validate(prefix + ".tenants." + t); err != nil {
				return err
			}
		}
		if len(cl.Hosts) > 0 && reminder.Channel(ch) != reminder.Webhook {
			return fmt.Errorf("rate limits: %s.hosts: only the webhook channel has target hosts", prefix)
		}
		for h, l := range cl.Hosts {
			if h == "" || h != strings.ToLower(h) || strings.ContainsAny(h, "/:@ ") {
				return fmt.Errorf("rate limits: %s.hosts.%q: want a host name in lower case, without scheme, port or path", prefix, h)
			}
			if err := l.validate(prefix + ".hosts." + h); err != nil {
				return err
			}
		}
		for name, pl := range cl.Providers {
			if pl.Account == "" {
				return fmt.Errorf("rate limits: %s.providers.%s.account is required", prefix, name)
			}
			if err := pl.Limit.validate(prefix + ".providers." + name); err != nil {
				return err
			}
		}
	}
	return nil
}

// SendJitter is how late a send may start after its slot: a worker that
// could not start by then (a stalled process) reserves a new slot instead.
// A send that starts late, or whose HTTP call takes a while, can land in the
// next window, so the account holds back rate × Headroom tokens of its burst
// (never the last one): the provider sees at most rate × window + burst in
// any window while sends reach it within Headroom of their slots.
const SendJitter = 150 * time.Millisecond

// Headroom covers SendJitter plus the provider call up to its arrival.
const Headroom = SendJitter + 50*time.Millisecond

// Tuning of the reservation (see nudge_rate_reserve, migration 0006).
const (
	// Lead is the earliest a slot starts after it is reserved: the worker's
	// time to claim the attempt before sending.
	Lead = 50 * time.Millisecond
	// Horizon is how far ahead a slot may be reserved: the longest a worker
	// holds a granted message before sending it. Everything that would wait
	// longer is handed back instead.
	Horizon = 250 * time.Millisecond
	// Active is how long a flow keeps its share of the account after the
	// turn of its last waiting message: a deferred message comes back at its
	// turn or a little after (a busy queue). Meanwhile the share is unused.
	Active = 250 * time.Millisecond
	// Bank is how much of its share a flow may save up, so that a flow whose
	// messages come back in bunches does not lose its share in between.
	Bank = 500 * time.Millisecond
)

func (l Limit) effectiveBurst() int {
	return max(1, l.Burst-int(math.Ceil(l.Rate*Headroom.Seconds())))
}

// Limiter grants send slots from the shared state.
type Limiter struct {
	db  pg.Querier
	cfg atomic.Pointer[Config]
	// provider names a channel's provider in use (nil: none named).
	provider func(channel string) string
}

// UseProviders makes Acquire take the limits of the provider current names
// for the channel, where the limits file has some (ChannelLimits.Providers).
// Call it before the first Acquire.
func (l *Limiter) UseProviders(current func(channel string) string) { l.provider = current }

// account returns the account and limit of the flow: its target host's
// (ChannelLimits.Hosts), else the channel's provider in use's, else the
// channel's.
func (l *Limiter) account(f Flow, cl ChannelLimits) (string, Limit) {
	if f.Host != "" && len(cl.Hosts) > 0 {
		if hl, ok := cl.Hosts[f.Host]; ok {
			return cl.Account + "/" + f.Host, hl
		}
		if hl, ok := cl.Hosts["default"]; ok {
			return cl.Account + "/" + f.Host, hl
		}
	}
	if l.provider != nil && len(cl.Providers) > 0 {
		if pl, ok := cl.Providers[l.provider(f.Channel)]; ok {
			return pl.Account, pl.Limit
		}
	}
	return cl.Account, cl.Limit
}

// Flow is what a reservation is for: a tenant's messages on a channel, and
// for the webhook channel their target host (lower case; "" for none).
type Flow struct {
	Channel, Tenant, Host string
}

// New returns a limiter for cfg.
func New(db pg.Querier, cfg Config) *Limiter {
	l := &Limiter{db: db}
	l.cfg.Store(&cfg)
	return l
}

// Config returns the active configuration.
func (l *Limiter) Config() Config { return *l.cfg.Load() }

// Set makes cfg the active configuration for the reservations that follow.
func (l *Limiter) Set(cfg Config) { l.cfg.Store(&cfg) }

// Grant is what Acquire gave.
type Grant struct {
	// Slots are the send times reserved, one per granted message, in order:
	// the first len(Slots) messages asked for are sent, each at its slot
	// (at most Horizon ahead). Nil: the channel is not limited, send all now.
	Slots []time.Time
	// Unlimited: the channel has no limits; everything is granted.
	Unlimited bool
	// NextAt is when the flow can next be granted a slot: the turn of the
	// first message that waited before and got none.
	NextAt time.Time
	// QueueAt is the turn of the first new message that got none: behind the
	// flow's messages deferred earlier.
	QueueAt time.Time
	// Spacing is the interval between turns: the k-th message past NextAt
	// or QueueAt can expect its turn k × Spacing later, at the earliest (at
	// the flow's cap, or the account's rate, not its share now).
	Spacing time.Duration
	// Share is the flow's rate now, sends per second.
	Share float64
}

// Granted is how many messages got a slot.
func (g Grant) Granted(want int) int {
	if g.Unlimited {
		return want
	}
	return len(g.Slots)
}

// Acquire reserves send slots for want messages of tenant on channel at now,
// in one round trip. The first want-fresh messages are ones that waited
// before (they are served first); the last fresh are new. Without limits
// for the channel everything is granted.
func (l *Limiter) Acquire(ctx context.Context, now time.Time, channel, tenant string, want, fresh int) (Grant, error) {
	return l.Reserve(ctx, now, Flow{Channel: channel, Tenant: tenant}, want, fresh)
}

// Reserve is Acquire for a flow that may name a target host: a webhook's
// messages to a host listed in ChannelLimits.Hosts take that host's limit,
// fleet-wide.
func (l *Limiter) Reserve(ctx context.Context, now time.Time, f Flow, want, fresh int) (Grant, error) {
	channel, tenant := f.Channel, f.Tenant
	cl, ok := l.Config().Channels[channel]
	if !ok || want <= 0 {
		return Grant{Unlimited: true}, nil
	}
	account, limit := l.account(f, cl)
	var capRate *float64
	flowBurst := 1
	if tl, ok := cl.Tenants[tenant]; ok {
		capRate, flowBurst = &tl.Rate, tl.Burst
	} else if dl, ok := cl.Tenants["default"]; ok {
		capRate, flowBurst = &dl.Rate, dl.Burst
	}
	var g Grant
	var next, queue time.Time
	if err := l.db.QueryRow(ctx, `SELECT slots, share, next_at, queue_at
		  FROM nudge_rate_reserve($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`,
		account, limit.Rate, limit.effectiveBurst(), channel+":"+tenant, capRate, flowBurst,
		want, min(max(fresh, 0), want), now, Lead, Horizon, Active, Bank,
	).Scan(&g.Slots, &g.Share, &next, &queue); err != nil {
		return Grant{}, fmt.Errorf("reserving %d %s slots for %s: %w", want, channel, tenant, err)
	}
	g.NextAt, g.QueueAt = next, queue
	// Turns follow at the most the flow could get, so that a share that
	// grows (other tenants finish) is used: see nudge_rate_reserve.
	most := limit.Rate
	if capRate != nil {
		most = min(most, *capRate)
	}
	g.Spacing = time.Duration(float64(time.Second) / most)
	if g.Slots == nil {
		g.Slots = []time.Time{}
	}
	return g, nil
}

// Version publishes the active limits file's version as
// nudge_rate_limit_config_info{version="..."} 1, so a dashboard shows which
// limits every replica runs with.
type Version struct{ g *prometheus.GaugeVec }

// ExportVersion registers the version metric on reg and sets it to cfg's.
func ExportVersion(reg prometheus.Registerer, cfg Config) *Version {
	v := &Version{g: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nudge_rate_limit_config_info",
		Help: "The version of the active rate-limits file (1 for the active one).",
	}, []string{"version"})}
	reg.MustRegister(v.g)
	v.Set(cfg.Version)
	return v
}

// Set makes version the only one exported.
func (v *Version) Set(version string) {
	v.g.Reset()
	v.g.WithLabelValues(version).Set(1)
}

// Reload reads the limits file at path again each time reload fires, until
// ctx ends: a valid file becomes active for the next reservation (logged,
// and exported through v); an invalid one is refused with the offending key
// and the active limits stay. Workers wire it to SIGHUP.
func Reload(ctx context.Context, reload <-chan os.Signal, path string, l *Limiter, v *Version, log zerolog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-reload:
		}
		cfg, err := Load(path)
		if err != nil {
			log.Error().Err(err).Str("active_version", l.Config().Version).Msg("rate limits reload refused; keeping the active limits")
			continue
		}
		l.Set(cfg)
		v.Set(cfg.Version)
		log.Info().Str("version", cfg.Version).Str("file", path).Msg("rate limits reloaded")
	}
}
