package worker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func TestDeadlineMargin(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	for _, tc := range []struct {
		name                        string
		configured, p99, sendTimout time.Duration
		measured                    int
		want                        time.Duration
	}{
		{"configured wins over a measure", 250 * ms, 2 * time.Second, 30 * time.Second, 500, 250 * ms},
		{"configured is not capped by the send timeout", 10 * time.Second, 0, 5 * time.Second, 0, 10 * time.Second},
		{"automatic before the first call", 0, 0, 30 * time.Second, 0, time.Second},
		{"automatic before the first call, a short send timeout", 0, 0, 400 * ms, 0, 400 * ms},
		{"negative is automatic", -time.Second, 0, 30 * time.Second, 0, time.Second},
		{"automatic: twice the p99", 0, 210 * ms, 30 * time.Second, 1000, 420 * ms},
		{"automatic: one call measured is enough", 0, 210 * ms, 30 * time.Second, 1, 420 * ms},
		{"automatic: at least the floor", 0, 3 * ms, 30 * time.Second, 1000, 100 * ms},
		{"automatic: a call measured at zero", 0, 0, 30 * time.Second, 1, 100 * ms},
		{"automatic: at most the send timeout", 0, 4 * time.Second, 5 * time.Second, 1000, 5 * time.Second},
	} {
		if got := deadlineMargin(tc.configured, tc.p99, tc.measured, tc.sendTimout); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestP99(t *testing.T) {
	t.Parallel()
	ramp := func(n int) []time.Duration {
		ds := make([]time.Duration, n)
		for i := range ds {
			ds[i] = time.Duration(n-i) * time.Millisecond // descending
		}
		return ds
	}
	for _, tc := range []struct {
		ds   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{ramp(1), time.Millisecond},
		{ramp(99), 99 * time.Millisecond},                      // fewer than 100: the largest
		{ramp(100), 99 * time.Millisecond},                     // the 99th of 100
		{ramp(101), 100 * time.Millisecond},                    // ceil(99.99) = 100th
		{ramp(1000), 990 * time.Millisecond},                   // the 990th of 1000
		{append(ramp(999), time.Hour), 990 * time.Millisecond}, // one outlier in 1000 does not move it
	} {
		if got := p99(tc.ds); got != tc.want {
			t.Errorf("p99 of %d: got %s, want %s", len(tc.ds), got, tc.want)
		}
	}
}

// p99 without a sort is the sorted slice's nearest rank, for every length up
// to past the window and for latencies with many ties and none, and leaves
// its input as it was.
func TestP99MatchesSortedRank(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(18, 2))
	for n := 1; n <= latencyWindow+200; n++ {
		for _, spread := range []int64{3, 1 << 40} { // ties everywhere; hardly any
			ds := make([]time.Duration, n)
			for i := range ds {
				ds[i] = time.Duration(r.Int64N(spread))
			}
			in := slices.Clone(ds)
			sorted := slices.Sorted(slices.Values(ds))
			want := sorted[(99*n+99)/100-1]
			if got := p99(ds); got != want {
				t.Fatalf("p99 of %d latencies (spread %d): got %d, want %d", n, spread, got, want)
			}
			if !slices.Equal(ds, in) {
				t.Fatalf("p99 of %d latencies changed its input", n)
			}
		}
	}
}

// BenchmarkLatenciesRecord is the cost of recording one provider call's
// latency with a full window of varied latencies (the real worker's case:
// a fake clock's equal latencies are what a sort does fastest).
func BenchmarkLatenciesRecord(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	ds := make([]time.Duration, 4096)
	for i := range ds {
		ds[i] = time.Duration(1e6 + r.Int64N(5e6)) // 1–6 ms
	}
	var l latencies
	for i := range latencyWindow {
		l.record(ds[i%len(ds)])
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		l.record(ds[i%len(ds)])
	}
}

// The window keeps the latest latencyWindow calls: a provider that was slow
// and became fast stops widening the margin once the slow calls age out.
func TestLatenciesForgetOldCalls(t *testing.T) {
	t.Parallel()
	var l latencies
	for range latencyWindow {
		l.record(2 * time.Second)
	}
	p, n := l.get()
	require.Equal(t, 2*time.Second, p)
	require.Equal(t, latencyWindow, n)
	for i := range latencyWindow {
		l.record(200 * time.Millisecond)
		if i == latencyWindow-latencyWindow/100-latencyRefresh {
			p, _ = l.get()
			require.Equal(t, 2*time.Second, p, "more than 1%% of the window is still slow")
		}
	}
	p, n = l.get()
	require.Equal(t, 200*time.Millisecond, p)
	require.Equal(t, 2*latencyWindow, n)
}

// marginSender stands at the provider boundary: it advances the worker's
// fake clock by wait (an adapter's own wait: a pooled connection, a dial),
// opens the gate as an adapter does, then takes latency to answer.
type marginSender struct {
	clock         *clock.Fake
	wait, latency time.Duration
	sent          []int64
	ctxLeft       []time.Duration // how long each call's context had left
}

func (s *marginSender) Send(ctx context.Context, m provider.Message) (string, error) {
	if d, ok := ctx.Deadline(); ok {
		s.ctxLeft = append(s.ctxLeft, time.Until(d))
	}
	s.clock.Advance(s.wait)
	if err := m.Open(); err != nil {
		return "", err
	}
	s.sent = append(s.sent, m.ReminderID)
	s.clock.Advance(s.latency)
	return fmt.Sprint("p-", m.ReminderID), nil
}

func marginWorker(t *testing.T, cfg Config, s *marginSender) *Worker {
	t.Helper()
	cfg.Channel = reminder.SMS
	w, err := New(cfg, Deps{Topology: topo, Clock: s.clock, Log: zerolog.Nop(), Sender: s, Rand: func() float64 { return 0 }})
	require.NoError(t, err)
	return w
}

func claimedItem(id int64, deadline time.Time) *item {
	return &item{row: store.Delivery{ID: id, Tenant: "acme", Channel: reminder.SMS, Deadline: deadline},
		att: store.Attempt{ReminderID: id, Fence: 2, Number: 1, AttemptID: id}}
}

// The margin is checked at the last moment: a send that passed the check
// before the adapter was called, then waited inside the adapter until its
// deadline was within the margin, does not leave: it expires, not sent.
func TestSendIsCheckedAgainRightBeforeTheRequestLeaves(t *testing.T) {
	t.Parallel()
	fc := clock.NewFake(t0)
	s := &marginSender{clock: fc, wait: 700 * time.Millisecond, latency: 200 * time.Millisecond}
	w := marginWorker(t, Config{DeadlineMargin: 500 * time.Millisecond}, s)

	late := claimedItem(1, at(time.Second)) // 1 s left; 300 ms after the adapter's wait
	w.send(context.Background(), late)
	require.Empty(t, s.sent, "the request did not leave")
	require.Equal(t, reminder.Expired, late.out.State())
	require.Equal(t, reminder.CodeDeadlineBeforeSend, late.out.Code)
	require.Equal(t, reminder.OutcomeNotSent, late.out.Attempt)
	require.Equal(t, "deadline_margin", late.code)
	require.Equal(t, "deadline within the send margin (500ms) before the send started", late.out.Reason)

	inTime := claimedItem(2, fc.Now().Add(1200*time.Millisecond+time.Nanosecond)) // 500 ms and 1 ns left after the wait
	w.send(context.Background(), inTime)
	require.Equal(t, []int64{2}, s.sent)
	require.Equal(t, reminder.Delivered, inTime.out.State())

	// Before the adapter is called at all.
	s.wait = 0
	before := claimedItem(3, fc.Now().Add(500*time.Millisecond))
	w.send(context.Background(), before)
	require.Equal(t, []int64{2}, s.sent)
	require.Equal(t, "deadline_margin", before.code)
	require.Len(t, s.ctxLeft, 2, "the adapter was not called for reminder 3")
}

// The provider call is bounded by the deadline (the time left on the
// worker's clock) as well as by SendTimeout.
func TestSendContextEndsAtTheDeadline(t *testing.T) {
	t.Parallel()
	fc := clock.NewFake(t0)
	s := &marginSender{clock: fc}
	w := marginWorker(t, Config{SendTimeout: 10 * time.Second, DeadlineMargin: time.Millisecond}, s)

	w.send(context.Background(), claimedItem(1, at(3*time.Second)))
	w.send(context.Background(), claimedItem(2, at(time.Hour)))
	require.Len(t, s.ctxLeft, 2)
	require.InDelta(t, 3*time.Second, s.ctxLeft[0], float64(time.Second), "bounded by the deadline, 3 s away")
	require.Greater(t, s.ctxLeft[0], 2*time.Second)
	require.LessOrEqual(t, s.ctxLeft[0], 3*time.Second)
	require.Greater(t, s.ctxLeft[1], 9*time.Second, "bounded by SendTimeout")
	require.LessOrEqual(t, s.ctxLeft[1], 10*time.Second)
}

// The automatic margin learns the provider's latency from the calls, from
// the moment the gate let each request go (the adapter's own waits do not
// count): 1 s before any call, then twice the p99.
func TestAutomaticMarginFollowsTheMeasuredLatency(t *testing.T) {
	t.Parallel()
	fc := clock.NewFake(t0)
	s := &marginSender{clock: fc, wait: 5 * time.Second, latency: 300 * time.Millisecond}
	w := marginWorker(t, Config{}, s)
	require.Equal(t, time.Second, w.deadlineMargin(), "before the first call")

	w.send(context.Background(), claimedItem(1, at(time.Hour)))
	require.Equal(t, 600*time.Millisecond, w.deadlineMargin(), "twice the one latency measured, without the 5 s wait")

	s.wait = 0
	for i := range int64(200) {
		s.latency = 100 * time.Millisecond
		if i%50 == 0 {
			s.latency = 400 * time.Millisecond // 4 slow calls in 201: above 1%
		}
		w.send(context.Background(), claimedItem(10+i, fc.Now().Add(time.Hour)))
	}
	require.Equal(t, 800*time.Millisecond, w.deadlineMargin(), "twice the p99 (400 ms)")

	// A send the learned margin refuses: 700 ms left.
	it := claimedItem(1000, fc.Now().Add(700*time.Millisecond))
	w.send(context.Background(), it)
	require.Equal(t, "deadline_margin", it.code)
}
