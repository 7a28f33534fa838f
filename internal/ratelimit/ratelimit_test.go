package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/testenv"
)

func TestParseNamesTheOffendingKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ file, want string }{
		{`{"version":"1","channels":{"sms":{"account":"a","rate":0,"burst":1}}}`, "channels.sms.rate"},
		{`{"version":"1","channels":{"sms":{"account":"a","rate":5,"burst":0}}}`, "channels.sms.burst"},
		{`{"version":"1","channels":{"sms":{"rate":5,"burst":1}}}`, "channels.sms.account"},
		{`{"version":"1","channels":{"fax":{"account":"a","rate":5,"burst":1}}}`, "channels.fax"},
		{`{"version":"1","channels":{"sms":{"account":"a","rate":5,"burst":1,"tenants":{"acme":{"rate":-1,"burst":1}}}}}`,
			"channels.sms.tenants.acme.rate"},
		{`{"channels":{"sms":{"account":"a","rate":5,"burst":1}}}`, "version is required"},
		{`{"version":"1","chanels":{}}`, `unknown field "chanels"`},
	} {
		_, err := ratelimit.Parse([]byte(tc.file))
		require.ErrorContains(t, err, tc.want, tc.file)
	}
	c, err := ratelimit.Parse([]byte(`{"version":"2026-11-30.1","channels":{"sms":{"account":"acct","rate":50,"burst":10,
		"tenants":{"default":{"rate":20,"burst":5},"a":{"rate":5,"burst":1}}}}}`))
	require.NoError(t, err)
	require.Equal(t, "2026-11-30.1", c.Version)
}

func TestAcquireIsGCRAAcrossKeys(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	cfg, err := ratelimit.Parse([]byte(`{"version":"1","channels":{"sms":{"account":"acct","rate":10,"burst":3,
		"tenants":{"slow":{"rate":1,"burst":1}}}}}`))
	require.NoError(t, err)
	l := ratelimit.New(db.Pool, cfg)
	t0 := time.Date(2026, 8, 12, 9, 0, 0, 0, time.UTC)

	g, err := l.Acquire(ctx, t0, "sms", "fast", 5)
	require.NoError(t, err)
	require.Equal(t, 2, g.Granted, "the account's burst, less the jitter headroom")
	require.Equal(t, t0.Add(100*time.Millisecond), g.RetryAt.UTC())

	g, err = l.Acquire(ctx, t0.Add(50*time.Millisecond), "sms", "fast", 1)
	require.NoError(t, err)
	require.Zero(t, g.Granted, "no token before the refill")

	// One second later the account has refilled, but not beyond its burst.
	g, err = l.Acquire(ctx, t0.Add(time.Second), "sms", "fast", 5)
	require.NoError(t, err)
	require.Equal(t, 2, g.Granted)

	// A tenant's own limit binds below the account's: every key grants the same.
	g, err = l.Acquire(ctx, t0.Add(2*time.Second), "sms", "slow", 5)
	require.NoError(t, err)
	require.Equal(t, 1, g.Granted)
	require.Equal(t, time.Second, g.Spacing)
	g, err = l.Acquire(ctx, t0.Add(2*time.Second+100*time.Millisecond), "sms", "fast", 1)
	require.NoError(t, err)
	require.Equal(t, 1, g.Granted, "the slow tenant took one account token, not five")

	// Over 20 seconds of steady demand, the account grants its rate (plus the burst).
	total := 0
	for ms := 0; ms < 20000; ms += 50 {
		g, err := l.Acquire(ctx, t0.Add(10*time.Second+time.Duration(ms)*time.Millisecond), "sms", "fast", 5)
		require.NoError(t, err)
		total += g.Granted
	}
	require.InDelta(t, 200, total, 3)

	// Channels without limits are not limited.
	g, err = l.Acquire(ctx, t0, "email", "x", 1000)
	require.NoError(t, err)
	require.Equal(t, 1000, g.Granted)
}
