package sms_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
)

func TestFailoverTrips(t *testing.T) {
	t.Parallel()
	cfg := sms.FailoverConfig{After: 3, ErrorRate: 0.5, MinSends: 10}.WithDefaults()
	for _, tc := range []struct {
		name string
		n    store.FailoverCounts
		want bool
	}{
		{"no failures", store.FailoverCounts{Sends: 50}, false},
		{"two in a row", store.FailoverCounts{Failures: 2, Sends: 2, Failed: 2}, false},
		{"three in a row", store.FailoverCounts{Failures: 3, Sends: 3, Failed: 3}, true},
		{"half of too few sends", store.FailoverCounts{Failures: 1, Sends: 8, Failed: 4}, false},
		{"half of enough sends", store.FailoverCounts{Failures: 1, Sends: 10, Failed: 5}, true},
		{"under the rate", store.FailoverCounts{Failures: 1, Sends: 10, Failed: 4}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, cfg.Trips(tc.n), "Trips(%+v)", tc.n)
		})
	}
	noRate := sms.FailoverConfig{After: 3}.WithDefaults()
	require.False(t, noRate.Trips(store.FailoverCounts{Failures: 1, Sends: 100, Failed: 99}), "zero error rate: no rate rule")
}

func TestFailoverConfigValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, sms.FailoverConfig{}.Validate())
	require.ErrorIs(t, sms.FailoverConfig{ErrorRate: 1.5}.Validate(), sms.ErrInvalidConfig)
	require.ErrorIs(t, sms.FailoverConfig{After: -1}.Validate(), sms.ErrInvalidConfig)
	_, err := sms.NewFailover(sms.FailoverConfig{}, nil)
	require.ErrorIs(t, err, sms.ErrInvalidConfig)
}

type failoverBundle struct {
	a, b   *bundle
	st     *store.Store
	clock  *clock.Fake
	cfg    sms.FailoverConfig
	closeA func()
	reg    *prometheus.Registry
}

func failoverSetup(t *testing.T) *failoverBundle {
	t.Helper()
	db := testenv.Postgres(t)
	fake := fakesms.New()
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	t.Cleanup(fake.Close)
	return &failoverBundle{
		a: &bundle{fake: fake, url: ts.URL, http: ts.Client()}, closeA: ts.Close, b: setup(t), st: store.New(db.Pool), clock: clock.NewFake(time.Date(2030, 1, 1, 9, 0, 0, 0, time.UTC)),
		cfg: sms.FailoverConfig{After: 3, ProbeEvery: 10 * time.Second, Cache: time.Second},
		reg: prometheus.NewRegistry(),
	}
}

// worker returns a Failover over a and b sharing the bundle's state, as one
// worker process would hold.
func (fb *failoverBundle) worker(t *testing.T) *sms.Failover {
	t.Helper()
	f, err := sms.NewFailover(fb.cfg, []sms.Named{{Name: "a", Looker: fb.a.client(t, time.Second)}, {Name: "b", Looker: fb.b.client(t, time.Second)}})
	require.NoError(t, err)
	f.Share(fb.st, fb.clock, zerolog.Nop(), fb.reg)
	return f
}

func (fb *failoverBundle) current(t *testing.T) string {
	t.Helper()
	cur, _, err := fb.st.FailoverCurrent(context.Background(), "sms", "a", fb.clock.Now())
	require.NoError(t, err)
	return cur
}

// Two workers: A answers 503, the third failure in a row moves both to B;
// while A still fails the probe falls through to B in the same send; once
// A recovers the probe brings the fleet back.
func TestFailoverMovesTheFleetAndComesBack(t *testing.T) {
	t.Parallel()
	fb := failoverSetup(t)
	ctx := context.Background()
	w1, w1Reg := fb.worker(t), fb.reg
	fb.reg = prometheus.NewRegistry() // each worker process has its own
	w2 := fb.worker(t)
	require.Equal(t, []string{"a", "b"}, w1.Providers())

	_, err := w1.Send(ctx, message("k0"))
	require.NoError(t, err)
	require.NoError(t, fb.a.fake.SetConfig(fakesms.Config{Rate5xx: 1}))
	for i, w := range []*sms.Failover{w1, w2, w1} {
		_, err := w.Send(ctx, message("k"+string(rune('1'+i))))
		requireSendError(t, err, provider.Retryable, "http_503")
	}
	require.Equal(t, "b", fb.current(t), "three 503s in a row, from two workers, move the fleet")
	require.Equal(t, "b", w1.Current(), "the worker that switched knows at once")
	require.Equal(t, 1.0, sum(t, w1Reg, "nudge_sms_provider_switches_total"), "w1 made the switch")

	_, err = w1.Send(ctx, message("k4"))
	require.NoError(t, err, "the worker that switched sends through b at once")
	fb.clock.Advance(time.Second)
	_, err = w2.Send(ctx, message("k5"))
	require.NoError(t, err, "the other worker reads the switch within its cache time")
	require.Len(t, fb.b.fake.Messages(), 2)

	// The probe is due; a still fails, so the message goes to b.
	fb.clock.Advance(10 * time.Second)
	_, err = w2.Send(ctx, message("k6"))
	require.NoError(t, err)
	require.Equal(t, "b", fb.current(t))
	require.Len(t, fb.b.fake.Messages(), 3)
	_, err = w1.Send(ctx, message("k7"))
	require.NoError(t, err, "one probe per interval: w1 does not probe again")
	require.Equal(t, 5, fb.a.fake.Stats().Attempts, "k0, three failures and one probe: no second probe")

	// a recovers: the next probe brings the fleet back.
	require.NoError(t, fb.a.fake.SetConfig(fakesms.Config{}))
	fb.clock.Advance(10 * time.Second)
	_, err = w1.Send(ctx, message("k8"))
	require.NoError(t, err)
	require.Equal(t, "a", fb.current(t))
	fb.clock.Advance(time.Second)
	_, err = w2.Send(ctx, message("k9"))
	require.NoError(t, err)
	require.Equal(t, 2.0, sum(t, w1Reg, "nudge_sms_provider_switches_total"), "w1 moved the fleet away, then its probe brought it back")
	require.Zero(t, sum(t, fb.reg, "nudge_sms_provider_switches_total"), "w2 only followed")
	require.Equal(t, 1.0, sum(t, fb.reg, "nudge_sms_provider_in_use"), "one provider in use")

	var atA, atB []string
	for _, m := range fb.a.fake.Messages() {
		atA = append(atA, m.IdempotencyKey)
	}
	for _, m := range fb.b.fake.Messages() {
		atB = append(atB, m.IdempotencyKey)
	}
	require.ElementsMatch(t, []string{"k0", "k8", "k9"}, atA)
	require.ElementsMatch(t, []string{"k4", "k5", "k6", "k7"}, atB)
}

// sum adds up the samples of the metric named name in reg.
func sum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	var total float64
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return total
}

// A lookup goes to the first provider before the second, and a first
// provider that cannot answer stops it: the second is not asked, and the
// caller may not send.
func TestFailoverLookupAsksEveryProviderInOrder(t *testing.T) {
	t.Parallel()
	fb := failoverSetup(t)
	ctx := context.Background()
	w := fb.worker(t)
	msg := message("held-at-a")
	msg.Earlier = []provider.Earlier{{AttemptID: 1, Started: fb.clock.Now().Add(-time.Minute)}}

	_, err := w.Lookup(ctx, msg)
	require.ErrorIs(t, err, provider.ErrNotFound, "at neither")
	require.Equal(t, 1, fb.a.fake.Stats().Lookups)
	require.Equal(t, 1, fb.b.fake.Stats().Lookups)

	_, err = fb.a.client(t, time.Second).Send(ctx, msg)
	require.NoError(t, err)
	id, err := w.Lookup(ctx, msg)
	require.NoError(t, err)
	require.NotEmpty(t, id)
	require.Equal(t, 1, fb.b.fake.Stats().Lookups, "found at a: b not asked")

	fb.closeA()
	_, err = w.Lookup(ctx, message("unknown-at-a"))
	require.Error(t, err)
	require.False(t, errors.Is(err, provider.ErrNotFound), "a could not answer: not 'not found'")
	require.Equal(t, 1, fb.b.fake.Stats().Lookups, "b is not asked before a has answered")
}

// A worker reports its successes to the shared row in batches, at most
// every Cache, and at once, ahead of it, with its next failure: the row
// then counts every send, and a success still breaks a run of failures.
func TestFailoverCountsSuccessesInBatches(t *testing.T) {
	t.Parallel()
	fb := failoverSetup(t)
	ctx := context.Background()
	w := fb.worker(t)
	counts := func() (sends, failed, failures int) {
		t.Helper()
		require.NoError(t, fb.st.Pool().QueryRow(ctx,
			`SELECT window_sends, window_failures, failures FROM provider_failover WHERE channel = 'sms'`).Scan(&sends, &failed, &failures))
		return sends, failed, failures
	}
	for i := range 5 {
		_, err := w.Send(ctx, message(fmt.Sprint("ok-", i)))
		require.NoError(t, err)
	}
	sends, _, _ := counts()
	require.Equal(t, 1, sends, "the first success is reported at once, the next four held back")
	fb.clock.Advance(time.Second)
	_, err := w.Send(ctx, message("ok-5"))
	require.NoError(t, err)
	sends, _, _ = counts()
	require.Equal(t, 6, sends, "a Cache later, the five held back are reported in one statement")

	require.NoError(t, fb.a.fake.SetConfig(fakesms.Config{Script: []fakesms.Outcome{"accept", "503", "503"}}))
	for i := range 3 {
		_, _ = w.Send(ctx, message(fmt.Sprint("mixed-", i)))
	}
	sends, failed, failures := counts()
	require.Equal(t, [3]int{9, 2, 2}, [3]int{sends, failed, failures},
		"the held-back success went with the first failure, ahead of it: two failures in a row, nine sends")
}

// An attempt recorded at one provider is looked up there only: found or
// not, the other is not asked.
func TestFailoverLookupAsksTheAttemptsProvider(t *testing.T) {
	t.Parallel()
	fb := failoverSetup(t)
	ctx := context.Background()
	w := fb.worker(t)
	msg := message("held-at-b")
	msg.Earlier = []provider.Earlier{{AttemptID: 1, Started: fb.clock.Now().Add(-time.Minute), Provider: "b"}}

	_, err := w.Lookup(ctx, msg)
	require.ErrorIs(t, err, provider.ErrNotFound)
	require.Zero(t, fb.a.fake.Stats().Lookups, "a, where the attempt did not go, is not asked")
	require.Equal(t, 1, fb.b.fake.Stats().Lookups)

	_, err = fb.b.client(t, time.Second).Send(ctx, msg)
	require.NoError(t, err)
	id, err := w.Lookup(ctx, msg)
	require.NoError(t, err)
	require.NotEmpty(t, id)
	require.Zero(t, fb.a.fake.Stats().Lookups)

	// A provider that could not answer is not replaced by another.
	msg.Earlier[0].Provider = "a"
	fb.closeA()
	_, err = w.Lookup(ctx, msg)
	require.Error(t, err)
	require.False(t, errors.Is(err, provider.ErrNotFound))
	require.Equal(t, 2, fb.b.fake.Stats().Lookups, "b is not asked about an attempt that went to a")
}

// A Failover without its shared state refuses to send rather than
// choosing alone.
func TestFailoverWithoutSharedStateSendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f, err := sms.NewFailover(sms.FailoverConfig{}, []sms.Named{{Name: "a", Looker: b.client(t, time.Second)}})
	require.NoError(t, err)
	_, err = f.Send(context.Background(), message("k"))
	requireSendError(t, err, provider.Retryable, provider.CodeNotStarted)
	require.ErrorIs(t, err, sms.ErrNoShared)
	require.Zero(t, b.fake.Stats().Attempts)
}

// --sms-providers builds a Failover over the listed adapters, each from its
// own flags; without it, --sms-api's adapter alone.
func TestFlagsBuildTheFailoverList(t *testing.T) {
	t.Parallel()
	parse := func(args ...string) *sms.Flags {
		var f sms.Flags
		fs := pflag.NewFlagSet("sms-worker", pflag.ContinueOnError)
		f.Register(fs)
		require.NoError(t, fs.Parse(args))
		return &f
	}
	f := parse("--sms-providers", "twilio,generic", "--twilio-account-sid", "AC00000000000000000000000000000abc",
		"--twilio-auth-token", "t", "--twilio-from", "+15005550006", "--sms-url", "http://127.0.0.1:9026",
		"--sms-failover-after", "2", "--sms-failover-probe", "5s")
	require.Equal(t, []string{"twilio", "generic"}, f.APIs())
	require.Equal(t, "http://127.0.0.1:9026", f.URL("generic"))
	require.Equal(t, sms.DefaultTwilioURL, f.URL("twilio"))
	require.Equal(t, 2, f.Failover.After)
	require.Equal(t, 5*time.Second, f.Failover.ProbeEvery)
	s, err := f.Sender(sms.DefaultTemplates(), time.Second)
	require.NoError(t, err)
	fo, ok := s.(*sms.Failover)
	require.True(t, ok, "got %T", s)
	require.Equal(t, []string{"twilio", "generic"}, fo.Providers())

	s, err = parse().Sender(sms.DefaultTemplates(), time.Second)
	require.NoError(t, err)
	require.IsType(t, &sms.Client{}, s, "no list: the generic adapter alone")

	_, err = parse("--sms-providers", "generic,carrier-pigeon").Sender(sms.DefaultTemplates(), time.Second)
	require.ErrorIs(t, err, sms.ErrInvalidConfig)
	_, err = parse("--sms-providers", "generic,generic").Sender(sms.DefaultTemplates(), time.Second)
	require.ErrorIs(t, err, sms.ErrInvalidConfig, "a provider listed twice")
}
