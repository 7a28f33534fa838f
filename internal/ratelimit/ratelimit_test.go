package ratelimit_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
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
		{`{"version":"1","channels":{"sms":{"account":"a","rate":5,"burst":1,"providers":{"twilio":{"rate":5,"burst":1}}}}}`,
			"channels.sms.providers.twilio.account"},
		{`{"version":"1","channels":{"sms":{"account":"a","rate":5,"burst":1,"providers":{"twilio":{"account":"t","rate":5,"burst":0}}}}}`,
			"channels.sms.providers.twilio.burst"},
		{`{"version":"1","channels":{"sms":{"account":"a","rate":5,"burst":1,"hosts":{"app.internal":{"rate":5,"burst":1}}}}}`,
			"channels.sms.hosts: only the webhook channel"},
		{`{"version":"1","channels":{"webhook":{"account":"a","rate":5,"burst":1,"hosts":{"https://App.internal":{"rate":5,"burst":1}}}}}`,
			`channels.webhook.hosts."https://App.internal": want a host name in lower case`},
		{`{"version":"1","channels":{"webhook":{"account":"a","rate":5,"burst":1,"hosts":{"app.internal":{"rate":0,"burst":1}}}}}`,
			"channels.webhook.hosts.app.internal.rate"},
	} {
		_, err := ratelimit.Parse([]byte(tc.file))
		require.ErrorContains(t, err, tc.want, tc.file)
	}
	c, err := ratelimit.Parse([]byte(`{"version":"2026-11-30.1","channels":{"sms":{"account":"acct","rate":50,"burst":10,
		"tenants":{"default":{"rate":20,"burst":5},"a":{"rate":5,"burst":1}}}}}`))
	require.NoError(t, err)
	require.Equal(t, "2026-11-30.1", c.Version)
	_, err = ratelimit.Parse([]byte(`{"version":"1","channels":{"webhook":{"account":"apps","rate":100,"burst":20,
		"tenants":{"edu":{"rate":10,"burst":5}}}}}`))
	require.NoError(t, err, "the webhook channel has limits too: per tenant, its application's")
}

func TestReserveSlotsIsGCRAWithinTheHorizon(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	cfg, err := ratelimit.Parse([]byte(`{"version":"1","channels":{"sms":{"account":"acct","rate":10,"burst":4}}}`))
	require.NoError(t, err)
	l := ratelimit.New(db.Pool, cfg)
	t0 := time.Date(2026, 8, 12, 9, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

	// The account's burst (4, less rate × Headroom for late sends) at
	// once after the lead, then one slot per 100 ms, never more than 250 ms
	// ahead.
	g, err := l.Acquire(ctx, t0, "sms", "fast", 5, 5)
	require.NoError(t, err)
	require.Equal(t, []time.Time{ms(50), ms(50), ms(100), ms(200)}, utc(g.Slots))
	require.Equal(t, ms(50), g.NextAt.UTC(), "the 300 ms slot can be reserved from 50 ms")
	require.Equal(t, ms(50), g.QueueAt.UTC())
	require.Equal(t, 10.0, g.Share)
	require.Equal(t, 100*time.Millisecond, g.Spacing)

	g, err = l.Acquire(ctx, ms(50), "sms", "fast", 1, 1)
	require.NoError(t, err)
	require.Equal(t, []time.Time{ms(300)}, utc(g.Slots))

	// New messages that get nothing queue behind the ones deferred before.
	g, err = l.Acquire(ctx, ms(60), "sms", "fast", 3, 3)
	require.NoError(t, err)
	require.Empty(t, g.Slots)
	g2, err := l.Acquire(ctx, ms(70), "sms", "fast", 1, 1)
	require.NoError(t, err)
	require.Empty(t, g2.Slots)
	require.Equal(t, g.QueueAt.Add(3*g.Spacing).UTC(), g2.QueueAt.UTC())

	// Channels without limits are not limited.
	g, err = l.Acquire(ctx, t0, "email", "x", 1000, 1000)
	require.NoError(t, err)
	require.Equal(t, 1000, g.Granted(1000))
}

// Each provider of a failover list keeps its own account and limit: while
// the fleet sends through twilio its slots come from twilio's account,
// generic's stay untouched, and a provider the file does not name uses the
// channel's.
func TestAcquireTakesTheLimitsOfTheProviderInUse(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	cfg, err := ratelimit.Parse([]byte(`{"version":"1","channels":{"sms":{"account":"acct","rate":10,"burst":4,
		"providers":{"twilio":{"account":"twilio-main","rate":10,"burst":2},"generic":{"account":"generic-main","rate":10,"burst":4}}}}}`))
	require.NoError(t, err)
	l := ratelimit.New(db.Pool, cfg)
	current := "twilio"
	l.UseProviders(func(channel string) string {
		require.Equal(t, "sms", channel)
		return current
	})
	t0 := time.Date(2026, 8, 12, 9, 0, 0, 0, time.UTC)
	slots := func() int {
		g, err := l.Acquire(ctx, t0, "sms", "acme", 10, 10)
		require.NoError(t, err)
		return len(g.Slots)
	}
	atTwilio := slots()
	require.Positive(t, atTwilio)
	require.Zero(t, slots(), "twilio's account has nothing more to give at t0")
	current = "generic"
	atGeneric := slots()
	require.Greater(t, atGeneric, atTwilio, "generic's own account (burst 4), untouched by twilio's sends")
	current = "carrier-pigeon"
	require.Greater(t, slots(), 0, "a provider the file does not name uses the channel's account")
}

// A webhook host listed in the file has an account of its own, fleet-wide:
// it runs dry without touching another host's; "default" gives each other
// host such an account; without it they share the channel's.
func TestReserveTakesTheTargetHostsLimit(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	t0 := time.Date(2026, 8, 12, 9, 0, 0, 0, time.UTC)
	slots := func(l *ratelimit.Limiter, host string) int {
		g, err := l.Reserve(ctx, t0, ratelimit.Flow{Channel: "webhook", Tenant: "acme", Host: host}, 10, 10)
		require.NoError(t, err)
		return len(g.Slots)
	}
	cfg, err := ratelimit.Parse([]byte(`{"version":"1","channels":{"webhook":{"account":"hooks","rate":10,"burst":4,
		"hosts":{"a.internal":{"rate":10,"burst":2}}}}}`))
	require.NoError(t, err)
	one, two := ratelimit.New(db.Pool, cfg), ratelimit.New(db.Pool, cfg) // two worker instances
	atA := slots(one, "a.internal")
	require.Positive(t, atA)
	require.Zero(t, slots(two, "a.internal"), "a.internal's account is shared by the fleet: nothing more at t0")
	require.Greater(t, slots(two, "b.internal"), atA, "b.internal, not listed, uses the channel's account, untouched")
	require.Zero(t, slots(one, "c.internal"), "and shares it with every other host not listed")

	cfg.Version, cfg.Channels["webhook"].Hosts["default"] = "2", ratelimit.Limit{Rate: 10, Burst: 2}
	one.Set(cfg)
	require.Positive(t, slots(one, "d.internal"), "with a default, each host has its own account")
	require.Positive(t, slots(one, "e.internal"))
	require.Zero(t, slots(one, "d.internal"))
}

// Flows that keep asking share the account max-min fairly, whatever they
// ask for; a flow's own limit caps its share and leaves the rest to the
// others; a flow that stops asking gives its share back.
func TestReserveSharesTheAccountFairly(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	cfg, err := ratelimit.Parse([]byte(`{"version":"1","channels":{"sms":{"account":"acct","rate":20,"burst":2,
		"tenants":{"capped":{"rate":2,"burst":1}}}}}`))
	require.NoError(t, err)
	l := ratelimit.New(db.Pool, cfg)
	t0 := time.Date(2026, 8, 12, 9, 0, 0, 0, time.UTC)

	got := map[string]int{}
	var slots []time.Time
	// Each flow has a backlog: what it asks for are messages that waited
	// before (fresh = 0), as they come back at their turns.
	ask := func(at time.Time, tenant string, want int) {
		g, err := l.Acquire(ctx, at, "sms", tenant, want, 0)
		require.NoError(t, err)
		got[tenant] += len(g.Slots)
		slots = append(slots, g.Slots...)
	}
	// 20 s: "big" asks for 50 every 50 ms, "small" for 2, "capped" for 5,
	// in turns (workers ask independently; none is always first).
	flows := []struct {
		tenant string
		want   int
	}{{"big", 50}, {"small", 2}, {"capped", 5}}
	for step := range 400 {
		at := t0.Add(time.Duration(step) * 50 * time.Millisecond)
		for k := range flows {
			f := flows[(step+k)%len(flows)]
			ask(at, f.tenant, f.want)
		}
	}
	t.Logf("20 s of contention: %v", got)
	// capped takes its own 2/s (less up to a tenth: with a burst of 1 it
	// cannot bank a slot it found taken); big and small split the rest.
	require.GreaterOrEqual(t, got["capped"], 35)
	require.LessOrEqual(t, got["capped"], 41)
	require.InDelta(t, 180, got["big"], 12)
	require.InDelta(t, 180, got["small"], 12)
	require.InDelta(t, 400, got["big"]+got["small"]+got["capped"], 4, "the account's rate, all of it used")
	// No one-second window of slots holds more than the rate plus the burst.
	sort.Slice(slots, func(i, j int) bool { return slots[i].Before(slots[j]) })
	for i, s0 := range slots {
		j := sort.Search(len(slots), func(k int) bool { return !slots[k].Before(s0.Add(time.Second)) })
		require.LessOrEqual(t, j-i, 22, "window from %s", s0)
	}

	// small and capped stop asking (their last waiting messages had turns up
	// to 2.5 s ahead: capped's fifth at 2/s): ratelimit.Active after those,
	// big has it all.
	clear(got)
	later := t0.Add(20*time.Second + 2500*time.Millisecond + ratelimit.Active)
	for step := range 100 {
		ask(later.Add(time.Duration(step)*50*time.Millisecond), "big", 50)
	}
	// 5 s at the account's whole rate, plus its burst and the slots reserved
	// up to the horizon ahead of the last ask.
	require.GreaterOrEqual(t, got["big"], 100)
	require.LessOrEqual(t, got["big"], 100+2+int(20*ratelimit.Horizon.Seconds())+1)
}

func utc(ts []time.Time) []time.Time {
	out := make([]time.Time, len(ts))
	for i, t := range ts {
		out[i] = t.UTC()
	}
	return out
}

// The limiter's cost: one round trip per tenant per worker batch, next to
// the cheapest round trip there is (SELECT 1) on the same pool. Run with
// go test -bench Reserve -run '^$' ./internal/ratelimit/ (figures in
// docs/rate-limits.md). Four flows contend for one account, as in the
// acceptance test; each call asks for a batch's part (12 messages).
func BenchmarkReserve(b *testing.B) {
	db := testenv.Postgres(b)
	ctx := context.Background()
	cfg, err := ratelimit.Parse([]byte(`{"version":"1","channels":{"sms":{"account":"acct","rate":50,"burst":10,
		"tenants":{"a":{"rate":5,"burst":1},"default":{"rate":30,"burst":5}}}}}`))
	require.NoError(b, err)
	l := ratelimit.New(db.Pool, cfg)
	tenants := []string{"a", "b", "c", "d"}
	const want = 12
	b.Run("select1", func(b *testing.B) {
		for range b.N {
			var one int
			if err := db.Pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reserve", func(b *testing.B) {
		start := time.Now()
		granted := 0
		for i := range b.N {
			g, err := l.Acquire(ctx, start.Add(time.Duration(i)*time.Millisecond), "sms", tenants[i%len(tenants)], want, want/2)
			if err != nil {
				b.Fatal(err)
			}
			granted += len(g.Slots)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*want), "ns/message")
		b.ReportMetric(float64(granted)/float64(b.N), "slots/call")
	})
}

// A reload makes a valid file active for the next reservation and exports
// its version; an invalid one is refused and the active limits stay.
func TestReloadAppliesAValidFileAndKeepsTheActiveOneOtherwise(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path := filepath.Join(t.TempDir(), "limits.json")
	write := func(body string) { require.NoError(t, os.WriteFile(path, []byte(body), 0o644)) }
	write(`{"version":"v1","channels":{"sms":{"account":"acct","rate":10,"burst":4}}}`)
	cfg, err := ratelimit.Load(path)
	require.NoError(t, err)
	l := ratelimit.New(db.Pool, cfg)
	reg := prometheus.NewRegistry()
	v := ratelimit.ExportVersion(reg, cfg)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := zerolog.New(zerolog.SyncWriter(lockedWriter{&mu, &logs}))
	hup := make(chan os.Signal)
	go ratelimit.Reload(ctx, hup, path, l, v, log)

	versions := func() []string {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		var out []string
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				out = append(out, m.GetLabel()[0].GetValue())
			}
		}
		return out
	}
	require.Equal(t, []string{"v1"}, versions())

	// Email becomes limited, sms changes account: both apply to the next reservation.
	write(`{"version":"v2","channels":{"email":{"account":"mail","rate":1,"burst":1}}}`)
	hup <- syscall.SIGHUP
	// The limiter takes the new file first, then the version gauge follows.
	require.Eventually(t, func() bool {
		return l.Config().Version == "v2" && slices.Equal(versions(), []string{"v2"})
	}, 5*time.Second, 10*time.Millisecond)
	g, err := l.Acquire(ctx, time.Now(), "email", "x", 5, 5)
	require.NoError(t, err)
	require.Len(t, g.Slots, 1, "email now limited to a burst of 1")
	g, err = l.Acquire(ctx, time.Now(), "sms", "x", 500, 500)
	require.NoError(t, err)
	require.Equal(t, 500, g.Granted(500), "sms no longer limited")

	// A broken file is refused, naming the key; v2 stays.
	write(`{"version":"v3","channels":{"sms":{"account":"a","rate":-1,"burst":1}}}`)
	hup <- syscall.SIGHUP
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(logs.String(), "channels.sms.rate must be a positive number")
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, "v2", l.Config().Version)
	require.Equal(t, []string{"v2"}, versions())
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
