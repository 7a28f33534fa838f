package campaign

import (
	"strings"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/ratelimit"
)

func TestAdmit(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	base := AdmissionInput{Now: now, Deadline: now.Add(time.Hour), Audience: 40_000, SliceSize: 200,
		RowTime: time.Millisecond, Rate: 50, Retry: 15 * time.Second}
	with := func(f func(*AdmissionInput)) AdmissionInput { in := base; f(&in); return in }
	tests := []struct {
		name     string
		in       AdmissionInput
		admitted bool
		planning time.Duration
		delivery time.Duration
	}{
		// 200 slices × (200 ms + 250 ms) = 90 s; 40,000 / 50 = 800 s; + 15 s.
		{"a campaign its window covers", base, true, 90 * time.Second, 800 * time.Second},
		{"one whose deadline is nearer than planning + delivery + retries",
			with(func(in *AdmissionInput) { in.Deadline = now.Add(904 * time.Second) }), false, 90 * time.Second, 800 * time.Second},
		{"exactly enough", with(func(in *AdmissionInput) { in.Deadline = now.Add(905 * time.Second) }), true, 90 * time.Second, 800 * time.Second},
		{"delivery waits for a due time later than planning",
			with(func(in *AdmissionInput) { in.DeliveryFrom = now.Add(50 * time.Minute) }), false, 90 * time.Second, 800 * time.Second},
		{"no rate limit: no delivery budget", with(func(in *AdmissionInput) { in.Rate = 0; in.Deadline = now.Add(106 * time.Second) }),
			true, 90 * time.Second, 0},
		{"slow slices", with(func(in *AdmissionInput) { in.RowTime = 100 * time.Millisecond }), false, 200 * (20*time.Second + SliceHop), 800 * time.Second},
		{"an override admits, recorded", with(func(in *AdmissionInput) { in.Deadline = now.Add(time.Minute); in.Override = "the board" }),
			true, 90 * time.Second, 800 * time.Second},
		{"a past deadline", with(func(in *AdmissionInput) { in.Deadline = now.Add(-time.Second) }), false, 90 * time.Second, 800 * time.Second},
		{"an empty audience still has the slice that finds it empty", with(func(in *AdmissionInput) { in.Audience = 0 }),
			true, 200*time.Millisecond + SliceHop, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := Admit(tt.in)
			if a.Admitted != tt.admitted || a.Planning != tt.planning || a.Delivery != tt.delivery {
				t.Errorf("Admit() = admitted %v, planning %s, delivery %s; want %v, %s, %s\n%s",
					a.Admitted, a.Planning, a.Delivery, tt.admitted, tt.planning, tt.delivery, a)
			}
			s := a.String()
			for _, want := range []string{"window", "planning", "slices", "retries", "needs"} {
				if !strings.Contains(s, want) {
					t.Errorf("String() has no %q:\n%s", want, s)
				}
			}
			if tt.in.Override != "" && !strings.Contains(s, "admitted by override: "+tt.in.Override) {
				t.Errorf("String() does not show the override:\n%s", s)
			}
		})
	}
}

func TestRateAndRetryBudgets(t *testing.T) {
	t.Parallel()
	l := ratelimit.Config{Channels: map[string]ratelimit.ChannelLimits{
		"sms": {Account: "main", Limit: ratelimit.Limit{Rate: 50, Burst: 10},
			Tenants:   map[string]ratelimit.Limit{"acme": {Rate: 5, Burst: 1}, "default": {Rate: 30, Burst: 5}},
			Providers: map[string]ratelimit.ProviderLimits{"twilio": {Account: "t", Limit: ratelimit.Limit{Rate: 20, Burst: 1}}}},
		"email": {Account: "ses", Limit: ratelimit.Limit{Rate: 14, Burst: 14}},
	}}
	for _, tt := range []struct {
		channel, tenant string
		want            float64
		from            string
	}{
		{"sms", "acme", 5, `tenant "acme"`},
		{"sms", "globex", 20, `provider "twilio"`},
		{"email", "acme", 14, `account "ses"`},
		{"webhook", "acme", 0, "no limit"},
	} {
		r, from := rate(l, tt.channel, tt.tenant)
		if r != tt.want || !strings.Contains(from, tt.from) {
			t.Errorf("rate(%s, %s) = %g (%s), want %g (%s)", tt.channel, tt.tenant, r, from, tt.want, tt.from)
		}
	}
	if d, _ := retryBudget(5, time.Second, time.Hour); d != 15*time.Second {
		t.Errorf("retryBudget(5, 1s, 1h) = %s, want 15s", d)
	}
	if d, _ := retryBudget(10, time.Second, 10*time.Second); d != 65*time.Second {
		t.Errorf("retryBudget(10, 1s, 10s) = %s, want 65s (1+2+4+8, then 10 five times)", d)
	}
	if d, _ := retryBudget(1, time.Second, time.Hour); d != 0 {
		t.Errorf("retryBudget(1, ...) = %s, want 0: no retry", d)
	}
}
