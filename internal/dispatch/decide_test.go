package dispatch

import (
	"slices"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/store"
)

func TestBudgetAllows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                   string
		spent, slowest, budget time.Duration
		want                   bool
	}{
		{"first batch", 0, 0, 4 * time.Minute, true},
		{"room for one more as slow as the slowest", 3 * time.Minute, 59 * time.Second, 4 * time.Minute, true},
		{"the next batch would end exactly at the budget", 3 * time.Minute, time.Minute, 4 * time.Minute, false},
		{"the next batch would overrun", 3*time.Minute + 30*time.Second, time.Minute, 4 * time.Minute, false},
		{"budget already spent", 5 * time.Minute, 0, 4 * time.Minute, false},
	} {
		if got := budgetAllows(tc.spent, tc.slowest, tc.budget); got != tc.want {
			t.Errorf("%s: budgetAllows(%s, %s, %s) = %v, want %v", tc.name, tc.spent, tc.slowest, tc.budget, got, tc.want)
		}
	}
}

func TestWorthReporting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		sum       Summary
		sinceLast time.Duration
		want      bool
	}{
		{"idle, reported a second ago", Summary{}, time.Second, false},
		{"idle, a minute since the last report", Summary{}, time.Minute, true},
		{"claimed something, a second since the last report", Summary{Claimed: 1}, time.Second, true},
		{"claimed something, 20 ms since the last report: merged with the next", Summary{Claimed: 1}, 20 * time.Millisecond, false},
		{"nothing reported yet (zero time, long ago)", Summary{Claimed: 1}, time.Since(time.Time{}), true},
	} {
		if got := worthReporting(tc.sum, tc.sinceLast); got != tc.want {
			t.Errorf("%s: worthReporting = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSummaryMerge(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	a := Summary{Passes: 1, Cutoff: t0, Batches: 1, Claimed: 40, Enqueued: 39, Expired: 1, Elapsed: 5 * time.Millisecond,
		Promoted: 3, Final: t0, Through: t0.Add(time.Hour)}
	b := Summary{Passes: 1, Cutoff: t0.Add(20 * time.Millisecond), Batches: 2, Claimed: 60, Enqueued: 58, Released: 2,
		Elapsed: 7 * time.Millisecond, Final: t0.Add(time.Second), Through: t0.Add(2 * time.Hour)}
	want := Summary{Passes: 2, Cutoff: b.Cutoff, Batches: 3, Claimed: 100, Enqueued: 97, Expired: 1, Released: 2,
		Elapsed: 12 * time.Millisecond, Promoted: 3, Final: b.Final, Through: b.Through}
	if got := (Summary{}).merge(a).merge(b); got.Cutoff != want.Cutoff || got.Passes != want.Passes ||
		got.Claimed != want.Claimed || got.Enqueued != want.Enqueued || got.Expired != want.Expired ||
		got.Released != want.Released || got.Batches != want.Batches || got.Elapsed != want.Elapsed ||
		got.Promoted != want.Promoted || got.Final != want.Final || got.Through != want.Through {
		t.Errorf("merge = %+v, want %+v", got, want)
	}
}

func TestPaceWait(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	at := func(d time.Duration) time.Time { return start.Add(d) }
	p := pace{Every: 100 * ms, MinGap: 20 * ms}
	for _, tc := range []struct {
		name     string
		p        pace
		elapsed  time.Duration // the pass's own time: now is start+elapsed
		more     bool
		next     time.Time
		failures int
		want     time.Duration
	}{
		{"nothing pending: every after the start, as a fixed tick", p, 5 * ms, false, time.Time{}, 0, 95 * ms},
		{"next due beyond every: every bounds the wait", p, 5 * ms, false, at(time.Hour), 0, 95 * ms},
		{"next due within every: wake at its due time", p, 5 * ms, false, at(60 * ms), 0, 55 * ms},
		{"next due before the min gap: the min gap holds", p, 5 * ms, false, at(10 * ms), 0, 15 * ms},
		{"next due already past (a stream): the min gap after the start", p, 5 * ms, false, at(2 * ms), 0, 15 * ms},
		{"a stream, the pass took longer than the min gap: at once", p, 30 * ms, false, at(25 * ms), 0, 0},
		{"due rows left behind: at once once the min gap has passed", p, 30 * ms, true, time.Time{}, 0, 0},
		{"due rows left behind by a short pass: the min gap still holds", p, 5 * ms, true, time.Time{}, 0, 15 * ms},
		{"the pass took longer than every: at once", p, 150 * ms, false, time.Time{}, 0, 0},
		{"a min gap above every is every", pace{Every: 100 * ms, MinGap: time.Second}, 5 * ms, false, at(ms), 0, 95 * ms},
		{"one failure: back-off of twice every, next due ignored", p, 5 * ms, false, at(10 * ms), 1, 200 * ms},
		{"three failures: every doubled three times", p, 5 * ms, true, time.Time{}, 3, 800 * ms},
		{"many failures: capped at maxBackoff", p, 5 * ms, false, time.Time{}, 20, maxBackoff},
		{"a failed pass slower than every: the back-off still", p, 150 * ms, false, time.Time{}, 1, 200 * ms},
	} {
		got := tc.p.wait(start, start.Add(tc.elapsed), tc.more, tc.next, tc.failures)
		if got != tc.want {
			t.Errorf("%s: wait(elapsed %s, more %v, next %v, failures %d) = %s, want %s",
				tc.name, tc.elapsed, tc.more, tc.next.Sub(start), tc.failures, got, tc.want)
		}
	}
}

func TestEnvelopeSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		more bool
		want int
	}{
		{"defaults, nothing due left after the claim", Config{}, false, 50},
		{"defaults, due rows left: a burst", Config{}, true, message.MaxBatchEntries},
		{"steady size set, burst by default", Config{EnvelopeSize: 20}, true, message.MaxBatchEntries},
		{"single messages: no envelopes in a burst either", Config{EnvelopeSize: 1}, true, 1},
		{"single messages with a burst size set", Config{EnvelopeSize: 1, BurstEnvelopeSize: 100}, true, 100},
		{"burst size below the steady one", Config{EnvelopeSize: 80, BurstEnvelopeSize: 60}, true, 80},
		{"burst size above the envelope's bound", Config{BurstEnvelopeSize: 500}, true, message.MaxBatchEntries},
		{"burst size set, not a burst", Config{BurstEnvelopeSize: 70}, false, 50},
	} {
		if got := envelopeSize(tc.cfg.WithDefaults(), tc.more); got != tc.want {
			t.Errorf("%s: envelopeSize(%+v, more %v) = %d, want %d", tc.name, tc.cfg, tc.more, got, tc.want)
		}
	}
}

func TestEnvelopeSplit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n, size int
		want    []int
	}{
		{0, 50, nil},
		{1, 50, []int{1}},
		{50, 50, []int{50}},
		{51, 50, []int{26, 25}},
		{127, 50, []int{43, 42, 42}},
		{150, 50, []int{50, 50, 50}},
		{7, 3, []int{3, 2, 2}},
		{500, 200, []int{167, 167, 166}},
		{3, 1, []int{1, 1, 1}},
		{3, 0, []int{1, 1, 1}},
	} {
		got := envelopeSplit(tc.n, tc.size)
		if !slices.Equal(got, tc.want) {
			t.Errorf("envelopeSplit(%d, %d) = %v, want %v", tc.n, tc.size, got, tc.want)
		}
		sum := 0
		for _, p := range got {
			sum += p
			if p > max(tc.size, 1) {
				t.Errorf("envelopeSplit(%d, %d): part %d over the size", tc.n, tc.size, p)
			}
		}
		if sum != tc.n {
			t.Errorf("envelopeSplit(%d, %d) carries %d reminders", tc.n, tc.size, sum)
		}
	}
}

func TestReusePromotion(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	final := t0.Add(time.Hour) // the last complete sweep's final watermark, H ahead
	done := store.Promotion{SweepDone: true, Final: final, Through: t0.Add(2 * time.Hour)}
	for _, tc := range []struct {
		name        string
		last        store.Promotion
		lastAt, now time.Time
		cutoff      time.Time // zero: now
		every       time.Duration
		want        bool
	}{
		{"within every, below final", done, t0, t0.Add(500 * time.Millisecond), time.Time{}, time.Second, true},
		{"just within every", done, t0, t0.Add(time.Second - time.Nanosecond), time.Time{}, time.Second, true},
		{"every has passed", done, t0, t0.Add(time.Second), time.Time{}, time.Second, false},
		{"no promoter pass yet", done, time.Time{}, t0, time.Time{}, time.Second, false},
		{"the sweep stopped at its batch limit (catching up)",
			store.Promotion{Final: final, Through: t0}, t0, t0.Add(time.Millisecond), time.Time{}, time.Second, false},
		{"negative every: a pass every time", done, t0, t0.Add(time.Millisecond), time.Time{}, -1, false},
		{"the clock went back", done, t0, t0.Add(-time.Millisecond), time.Time{}, time.Second, false},
		// The edge: a reminder due at final may still lack its state row.
		{"cutoff just below final", done, t0, t0.Add(time.Millisecond), final.Add(-time.Microsecond), time.Hour, true},
		{"cutoff at final", done, t0, t0.Add(time.Millisecond), final, time.Hour, false},
		{"cutoff past final (final held back by a long transaction)",
			store.Promotion{SweepDone: true, Final: t0.Add(-time.Minute)}, t0, t0.Add(time.Millisecond), time.Time{}, time.Second, false},
		{"nothing promoted yet: final at its initial value", store.Promotion{SweepDone: true}, t0, t0.Add(time.Millisecond),
			time.Time{}, time.Second, false},
	} {
		cutoff := tc.cutoff
		if cutoff.IsZero() {
			cutoff = tc.now
		}
		if got := reusePromotion(tc.last, tc.lastAt, tc.now, cutoff, tc.every); got != tc.want {
			t.Errorf("%s: reusePromotion = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The skip's edge as the claim sees it: a reused pass claims up to the
// cutoff, never past final, where a lazy reminder may still lack its row.
func TestReusedPromotionClaimsBelowFinal(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for _, last := range []store.Promotion{
		{SweepDone: true, Final: t0.Add(time.Hour), Through: t0.Add(2 * time.Hour)},
		{SweepDone: true, Final: t0.Add(time.Hour)}, // nothing lazy beyond the sweep
	} {
		for _, cutoff := range []time.Time{t0, last.Final.Add(-time.Microsecond), last.Final} {
			if !reusePromotion(last, t0, t0.Add(time.Millisecond), cutoff, time.Hour) {
				continue
			}
			if got := last.ClaimCutoff(cutoff); !got.Before(last.Final) {
				t.Errorf("%+v, cutoff %s: a reused pass claims up to %s, not below final", last, cutoff, got)
			}
		}
	}
}
