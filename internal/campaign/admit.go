package campaign

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/pkg/localtime"
)

// Admission's stated defaults and bounds.
const (
	// DefaultRowTime is the planning time per audience row assumed while
	// this installation has fewer than MinSlicesMeasured measured slices:
	// 10 ms, a slice of 200 in 2 s, about twenty times what the planning
	// benchmark measures (docs/benchmarks.md), so a first campaign is
	// judged conservatively.
	DefaultRowTime = 10 * time.Millisecond
	// MinSlicesMeasured is how many measured slices (of at least
	// minRowsMeasured rows) the checkpoint log needs before their time is used.
	MinSlicesMeasured = 10
	// SliceHop is added to every slice for what its measured time leaves
	// out: publishing the next command (confirmed) and its delivery.
	SliceHop = 250 * time.Millisecond
	// slicesMeasured is how many recent slices the measure reads.
	slicesMeasured  = 1000
	minRowsMeasured = 20
)

// ErrNotAdmitted: the campaign's window cannot cover its planning,
// delivery and retry budgets (the error says every number).
var ErrNotAdmitted = errors.New("campaign not admitted")

// AdmissionInput is what the admission decides on.
type AdmissionInput struct {
	Now      time.Time `json:"now"`
	Deadline time.Time `json:"deadline"`
	// DeliveryFrom is when sends may start at the earliest: the fixed due
	// time (a local one read in the default zone); zero for due times of
	// each recipient's own (taken as soon as planned).
	DeliveryFrom time.Time `json:"delivery_from"`
	Audience     int64     `json:"audience"`
	AudienceFrom string    `json:"audience_from"`
	SliceSize    int       `json:"slice_size"`
	// RowTime is the planning time per audience row (a slice takes
	// RowTime × SliceSize + SliceHop).
	RowTime     time.Duration `json:"row_time"`
	RowTimeFrom string        `json:"row_time_from"`
	// Rate is the channel's sends per second for the tenant (0: no limit).
	Rate     float64 `json:"rate"`
	RateFrom string  `json:"rate_from"`
	// Retry is the time one reminder's retries may take.
	Retry     time.Duration `json:"retry"`
	RetryFrom string        `json:"retry_from"`
	// Override, when not empty, admits a campaign the numbers refuse; it is
	// recorded with them.
	Override string `json:"override,omitempty"`
}

// Admission is the admission's record: its inputs, the budgets, the verdict
// (stored as JSON in campaigns.admission; durations in nanoseconds).
type Admission struct {
	AdmissionInput
	Slices    int64         `json:"slices"`
	SliceTime time.Duration `json:"slice_time"`
	Planning  time.Duration `json:"planning"`
	Delivery  time.Duration `json:"delivery"`
	// Finish is when planning, delivery and retries end at the earliest.
	Finish   time.Time     `json:"finish"`
	Window   time.Duration `json:"window"`
	Need     time.Duration `json:"need"`
	Admitted bool          `json:"admitted"`
}

// Admit decides whether the window from now to the deadline covers the
// campaign: planning (slices × slice time), then delivery (audience ÷ rate,
// starting no earlier than the due time), then one reminder's retries.
func Admit(in AdmissionInput) Admission {
	a := Admission{AdmissionInput: in}
	size := max(in.SliceSize, 1)
	a.Slices = (in.Audience + int64(size) - 1) / int64(size)
	if a.Slices == 0 {
		a.Slices = 1 // the slice that finds the audience empty
	}
	a.SliceTime = in.RowTime*time.Duration(size) + SliceHop
	a.Planning = time.Duration(a.Slices) * a.SliceTime
	if in.Rate > 0 {
		a.Delivery = time.Duration(math.Ceil(float64(in.Audience) / in.Rate * float64(time.Second)))
	}
	start := in.Now.Add(a.Planning)
	if in.DeliveryFrom.After(start) {
		start = in.DeliveryFrom
	}
	a.Finish = start.Add(a.Delivery + in.Retry)
	a.Window = in.Deadline.Sub(in.Now)
	a.Need = a.Finish.Sub(in.Now)
	a.Admitted = !a.Finish.After(in.Deadline) || in.Override != ""
	return a
}

// String prints every number of the admission.
func (a Admission) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "window %s: from now %s to the deadline %s\n", round(a.Window), a.Now.UTC().Format(time.RFC3339),
		a.Deadline.UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "planning %s: %d audience rows (%s) / slice size %d = %d slices × %s (%s per row, %s; + %s per slice for the next command)\n",
		round(a.Planning), a.Audience, a.AudienceFrom, a.SliceSize, a.Slices, round(a.SliceTime), a.RowTime, a.RowTimeFrom, SliceHop)
	if a.Rate > 0 {
		fmt.Fprintf(&b, "delivery %s: %d reminders / %g sends per second (%s)", round(a.Delivery), a.Audience, a.Rate, a.RateFrom)
	} else {
		fmt.Fprintf(&b, "delivery 0s: no rate limit (%s)", a.RateFrom)
	}
	if !a.DeliveryFrom.IsZero() {
		fmt.Fprintf(&b, ", starting at the due time %s at the earliest", a.DeliveryFrom.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(&b, "\nretries %s: %s\n", round(a.Retry), a.RetryFrom)
	fmt.Fprintf(&b, "needs %s, done at %s; the window is %s", round(a.Need), a.Finish.UTC().Format(time.RFC3339), round(a.Window))
	if a.Override != "" {
		fmt.Fprintf(&b, "\nadmitted by override: %s", a.Override)
	}
	return b.String()
}

func round(d time.Duration) time.Duration {
	if d > time.Minute || d < -time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

// Budget is what the operator tells the admission about the fleet.
type Budget struct {
	// Limits is the fleet's rate-limits file (its Channels: none, no limit).
	Limits     ratelimit.Config
	LimitsFrom string
	// The workers' retry policy (worker --max-attempts, --backoff-base,
	// --backoff-max): the retry budget is the backoff of every retry.
	MaxAttempts             int
	BackoffBase, BackoffMax time.Duration
	// Audience, when positive, is the operator's estimate, used instead of
	// counting the source (which needs read access to it).
	Audience int64
	// SliceSize is the size in force when the campaign sets none.
	SliceSize int
	// Override admits whatever the numbers say, recorded.
	Override string
}

// Assess gathers the admission's inputs for spec s (the audience counted
// with q's rights, the slice time from this installation's checkpoint log)
// and decides.
func Assess(ctx context.Context, q pg.Querier, s Spec, b Budget, now time.Time) (Admission, error) {
	in := AdmissionInput{Now: now, Deadline: s.Deadline, Override: b.Override, SliceSize: s.SliceSize}
	if in.SliceSize <= 0 {
		in.SliceSize = b.SliceSize
	}
	if in.SliceSize <= 0 {
		in.SliceSize = DefaultSliceSize
	}
	switch {
	case s.DueAt != nil:
		in.DeliveryFrom = *s.DueAt
	case s.DueLocal != nil:
		zone := s.DefaultZone
		if zone == "" {
			zone = "UTC"
		}
		loc, err := localtime.LoadZone(zone)
		if err != nil {
			return Admission{}, fmt.Errorf("default zone: %w", err)
		}
		in.DeliveryFrom = localtime.Resolve(*s.DueLocal, loc)
	}
	in.Audience, in.AudienceFrom = b.Audience, "the operator's estimate"
	if b.Audience <= 0 {
		if err := q.QueryRow(ctx, query("SourceSize"), s.Source).Scan(&in.Audience); err != nil {
			return Admission{}, fmt.Errorf("counting the audience of source %q (give an estimate instead): %w", s.Source, err)
		}
		in.AudienceFrom = "counted in the source"
	}
	var n int
	var perRow *float64
	if err := q.QueryRow(ctx, query("RowTime"), slicesMeasured, minRowsMeasured).Scan(&n, &perRow); err != nil {
		return Admission{}, fmt.Errorf("measuring the slice time: %w", err)
	}
	if n >= MinSlicesMeasured && perRow != nil {
		in.RowTime = time.Duration(*perRow * float64(time.Millisecond))
		in.RowTimeFrom = fmt.Sprintf("p95 of the last %d slices of this installation", n)
	} else {
		in.RowTime = DefaultRowTime
		in.RowTimeFrom = fmt.Sprintf("the default: %d measured slices, %d needed", n, MinSlicesMeasured)
	}
	in.Rate, in.RateFrom = rate(b.Limits, s.Channel, s.Tenant)
	if b.LimitsFrom != "" {
		in.RateFrom += " in " + b.LimitsFrom
	}
	in.Retry, in.RetryFrom = retryBudget(b.MaxAttempts, b.BackoffBase, b.BackoffMax)
	return Admit(in), nil
}

// rate is the sends per second the limits give channel's tenant: the
// lowest of the channel's account, its providers' and the tenant's own
// allowance (its entry, else "default"); 0 when the channel has none.
func rate(l ratelimit.Config, channel, tenant string) (float64, string) {
	cl, ok := l.Channels[channel]
	if !ok {
		return 0, fmt.Sprintf("no limit for channel %q", channel)
	}
	r, from := cl.Rate, fmt.Sprintf("account %q of channel %s", cl.Account, channel)
	for name, p := range cl.Providers {
		if p.Rate < r {
			r, from = p.Rate, fmt.Sprintf("provider %q of channel %s", name, channel)
		}
	}
	t, ok := cl.Tenants[tenant]
	who := fmt.Sprintf("tenant %q", tenant)
	if !ok {
		t, ok = cl.Tenants["default"]
		who = "the default tenant allowance"
	}
	if ok && t.Rate < r {
		r, from = t.Rate, who+" on channel "+channel
	}
	return r, from
}

// retryBudget is the longest a reminder's retries wait, the workers' backoff
// without jitter: base, 2×base … capped at max, for each attempt after the
// first.
func retryBudget(attempts int, base, most time.Duration) (time.Duration, string) {
	var d time.Duration
	for i := 0; i < attempts-1; i++ {
		step := base << min(i, 30)
		if step <= 0 || step > most {
			step = most
		}
		d += step
	}
	return d, fmt.Sprintf("%d attempts, backoff %s doubling to at most %s", attempts, base, most)
}
