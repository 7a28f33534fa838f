package dispatch

import (
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/message"
)

func TestEnvelopeLimitDue(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		now, readAt time.Time
		want        bool
	}{
		{"never read: the first run reads it", t0, time.Time{}, true},
		{"read this run's instant", t0, t0, false},
		{"read 59 s ago", t0.Add(59 * time.Second), t0, false},
		{"read a minute ago", t0.Add(time.Minute), t0, true},
		{"read an hour ago", t0.Add(time.Hour), t0, true},
		{"the clock went back", t0.Add(-time.Second), t0, true},
	} {
		if got := envelopeLimitDue(tc.now, tc.readAt); got != tc.want {
			t.Errorf("%s: envelopeLimitDue(%s, %s) = %v, want %v", tc.name, tc.now, tc.readAt, got, tc.want)
		}
	}
}

func TestCapEnvelopes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		cfg                 Config
		limit               int
		wantSteady, wantBur int
	}{
		{"defaults before migration 49: the burst's 200 held at 100", Config{}, 100, 50, 100},
		{"defaults after it", Config{}, 200, 50, 200},
		{"both above the old limit", Config{EnvelopeSize: 150, BurstEnvelopeSize: 200}, 100, 100, 100},
		{"both within it", Config{EnvelopeSize: 150, BurstEnvelopeSize: 200}, 200, 150, 200},
		{"an operator's lower limit", Config{}, 20, 20, 20},
		{"no envelopes at all stay none", Config{EnvelopeSize: 1}, 200, 1, 1},
		{"a limit above what this release reads: MaxBatchEntries", Config{EnvelopeSize: 200, BurstEnvelopeSize: 200}, 1000, 200, 200},
		{"no limit known: the previous release's", Config{BurstEnvelopeSize: 200}, 0, 50, 100},
	} {
		got := capEnvelopes(tc.cfg.WithDefaults(), tc.limit)
		if got.EnvelopeSize != tc.wantSteady || got.BurstEnvelopeSize != tc.wantBur {
			t.Errorf("%s: capEnvelopes(%+v, %d) = envelope %d, burst %d; want %d, %d", tc.name, tc.cfg, tc.limit,
				got.EnvelopeSize, got.BurstEnvelopeSize, tc.wantSteady, tc.wantBur)
		}
	}
	if message.PreviousMaxBatchEntries > message.MaxBatchEntries {
		t.Errorf("the previous release's limit %d is above this release's %d", message.PreviousMaxBatchEntries, message.MaxBatchEntries)
	}
}
