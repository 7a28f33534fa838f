package dispatch

import (
	"errors"
	"testing"
	"time"
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

func TestWorthRecording(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		sum       Summary
		err       error
		sinceLast time.Duration
		want      bool
	}{
		{"idle, recorded a second ago", Summary{}, nil, time.Second, false},
		{"idle, a minute since the last record", Summary{}, nil, time.Minute, true},
		{"claimed something", Summary{Claimed: 1}, nil, time.Second, true},
		{"failed", Summary{}, errors.New("broker down"), time.Second, true},
		{"out of budget", Summary{OutOfBudget: true}, nil, time.Second, true},
	} {
		if got := worthRecording(tc.sum, tc.err, tc.sinceLast); got != tc.want {
			t.Errorf("%s: worthRecording = %v, want %v", tc.name, got, tc.want)
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
		{"defaults, due rows left: a burst", Config{}, true, 100},
		{"steady size set, burst by default", Config{EnvelopeSize: 20}, true, 100},
		{"single messages: no envelopes in a burst either", Config{EnvelopeSize: 1}, true, 1},
		{"single messages with a burst size set", Config{EnvelopeSize: 1, BurstEnvelopeSize: 100}, true, 100},
		{"burst size below the steady one", Config{EnvelopeSize: 80, BurstEnvelopeSize: 60}, true, 80},
		{"burst size above the envelope's bound", Config{BurstEnvelopeSize: 500}, true, 100},
		{"burst size set, not a burst", Config{BurstEnvelopeSize: 70}, false, 50},
	} {
		if got := envelopeSize(tc.cfg.WithDefaults(), tc.more); got != tc.want {
			t.Errorf("%s: envelopeSize(%+v, more %v) = %d, want %d", tc.name, tc.cfg, tc.more, got, tc.want)
		}
	}
}
