// Package ratelimit enforces provider and tenant capacity across the whole
// fleet. A limit that each replica enforced alone would break the moment the
// Deployment scales, so the state lives in PostgreSQL (table rate_limits, one
// GCRA theoretical arrival time per key) and a worker takes the tokens for a
// whole batch in one round trip (nudge_rate_acquire). A message that gets no
// token is not waited for: the worker hands it back through a retry tier
// until the time the limiter says a token will be free, or expires it as
// rate_limited when that is past its deadline.
//
// Accuracy: a token is spent when granted, and a worker sends the messages it
// was granted tokens for at once. The grant-to-send time varies (a claim
// statement, an HTTP call), so sends granted at the end of one window can land
// in the next; the limiter keeps rate × SendJitter tokens of the burst back
// for that, and the provider sees at most rate × window + burst in any window
// as long as grant-to-send stays under SendJitter. Tokens granted for sends
// that then fail are not returned: under failures the observed rate is below
// the limit, never above.
package ratelimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
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
		if ch != "email" && ch != "sms" {
			return fmt.Errorf("rate limits: channels.%s: channel must be email or sms", ch)
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
	}
	return nil
}

// SendJitter is the headroom kept for the time between a token's grant and
// its send reaching the provider (the claim statement, the HTTP call): sends
// granted in one window can land in the next, so the limiter holds back
// rate × SendJitter tokens of the burst (never the last one) and the
// provider still sees at most rate × window + burst in any window.
const SendJitter = 50 * time.Millisecond

func (l Limit) effectiveBurst() int {
	return max(1, l.Burst-int(math.Ceil(l.Rate*SendJitter.Seconds())))
}

// Querier runs the acquire statement (a pool).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Limiter grants tokens from the shared state.
type Limiter struct {
	db  Querier
	cfg Config
}

// New returns a limiter for cfg.
func New(db Querier, cfg Config) *Limiter { return &Limiter{db: db, cfg: cfg} }

// Config returns the active configuration.
func (l *Limiter) Config() Config { return l.cfg }

type key struct {
	name  string
	limit Limit
}

func (l *Limiter) keys(channel, tenant string) []key {
	cl, ok := l.cfg.Channels[channel]
	if !ok {
		return nil
	}
	keys := []key{{name: "account:" + cl.Account, limit: cl.Limit}}
	if tl, ok := cl.Tenants[tenant]; ok {
		keys = append(keys, key{name: "tenant:" + channel + ":" + tenant, limit: tl})
	} else if dl, ok := cl.Tenants["default"]; ok {
		keys = append(keys, key{name: "tenant:" + channel + ":" + tenant, limit: dl})
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].name < keys[j].name })
	return keys
}

// Grant is what Acquire gave.
type Grant struct {
	// Granted tokens, 0..want.
	Granted int
	// RetryAt is when the next token will be free (zero when all were granted).
	RetryAt time.Time
	// Spacing is the refill interval of the tightest key: the k-th message
	// beyond RetryAt can expect a token about k × Spacing later.
	Spacing time.Duration
}

// Acquire asks for want tokens for sends of tenant on channel at now.
// Without limits for the channel everything is granted.
func (l *Limiter) Acquire(ctx context.Context, now time.Time, channel, tenant string, want int) (Grant, error) {
	keys := l.keys(channel, tenant)
	if len(keys) == 0 || want <= 0 {
		return Grant{Granted: want}, nil
	}
	var spacing time.Duration
	for _, k := range keys {
		spacing = max(spacing, time.Duration(float64(time.Second)/k.limit.Rate))
	}
	names := make([]string, len(keys))
	intervals := make([]int64, len(keys))
	bursts := make([]int32, len(keys))
	for i, k := range keys {
		names[i] = k.name
		intervals[i] = int64(math.Round(1e6 / k.limit.Rate))
		bursts[i] = int32(k.limit.effectiveBurst())
	}
	var granted int
	var retry *time.Time
	if err := l.db.QueryRow(ctx, `SELECT granted, retry_at FROM nudge_rate_acquire($1, $2, $3, $4, $5)`,
		names, intervals, bursts, want, now).Scan(&granted, &retry); err != nil {
		return Grant{}, fmt.Errorf("acquiring %d %s tokens for %s: %w", want, channel, tenant, err)
	}
	g := Grant{Granted: granted, Spacing: spacing}
	if retry != nil {
		g.RetryAt = *retry
	}
	return g, nil
}

// ExportVersion publishes the active limits file's version as
// nudge_rate_limit_config_info{version="..."} 1, so a dashboard shows which
// limits every replica runs with.
func ExportVersion(reg prometheus.Registerer, cfg Config) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "nudge_rate_limit_config_info",
		Help: "The version of the active rate-limits file (1 for the active one).",
	}, []string{"version"})
	g.WithLabelValues(cfg.Version).Set(1)
	reg.MustRegister(g)
}
