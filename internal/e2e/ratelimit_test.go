package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// SMS worker processes share one provider account limited to 50/s (burst
// 10); tenant A may use 5/s, every other tenant 30/s. A has 5,000 reminders
// due, C and D 3,000 each, and B 200, all due at the same moment. One worker
// runs for the first 12 s, four from then on. What the provider sees: at most
// the rate plus the burst in any one-second window, the rate itself over 20
// s and in each phase (one worker or four), A held to its own 5/s, and B
// done at its fair share of the account, not after anyone's backlog.
func TestFleetWideRateLimit(t *testing.T) {
	t.Parallel()
	f := newProcFleet(t, false)
	ctx := context.Background()
	limits := filepath.Join(t.TempDir(), "limits.json")
	require.NoError(t, os.WriteFile(limits, []byte(`{"version": "test-1", "channels": {"sms": {
		"account": "main", "rate": 50, "burst": 10,
		"tenants": {"tenant-a": {"rate": 5, "burst": 1}, "default": {"rate": 30, "burst": 5}}}}}`), 0o644))

	now := time.Now()
	var reqs []intake.Request
	add := func(tenant string, n int) {
		for i := range n {
			reqs = append(reqs, intake.Request{Tenant: tenant, Key: fmt.Sprint("k", i), Channel: reminder.SMS,
				Recipient: fmt.Sprintf("+1415%07d", len(reqs)), Template: "course-expiry",
				DueAt: now.Add(-time.Second), Deadline: now.Add(time.Hour)})
		}
	}
	add("tenant-a", 5000) // queued first: the noisy tenant
	add("tenant-c", 3000)
	add("tenant-d", 3000)
	add("tenant-b", 200)
	for i := 0; i < len(reqs); i += 2000 {
		out, err := intake.ScheduleMany(ctx, f.db.Pool, reqs[i:min(i+2000, len(reqs))])
		require.NoError(t, err)
		for _, o := range out {
			require.NoError(t, o.Err)
		}
	}
	f.runOK(t, "dispatcher")
	// The provider's clock measures the fleet's rate, so the disk must not
	// stall it: the seeding's (and earlier tests') dirty pages are written
	// now, not by a checkpoint in the middle of the measured seconds.
	_, err := f.db.Pool.Exec(ctx, "CHECKPOINT")
	require.NoError(t, err)
	start := time.Now()
	workers := []*testenv.Proc{f.start(t, "sms-worker", f.env(), "--limits", limits)}
	time.Sleep(12 * time.Second)
	for range 3 {
		workers = append(workers, f.start(t, "sms-worker", f.env(), "--limits", limits))
	}
	time.Sleep(16 * time.Second)
	for _, w := range workers {
		stop(t, w)
	}

	msgs := f.sms.Messages()
	times := make([]time.Time, 0, len(msgs))
	var bDone time.Time
	bCount, aCount := 0, 0
	for _, m := range msgs {
		times = append(times, m.AcceptedAt)
		switch m.Tenant {
		case "tenant-b":
			bCount++
			if m.AcceptedAt.After(bDone) {
				bDone = m.AcceptedAt
			}
		case "tenant-a":
			aCount++
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	require.NotEmpty(t, times)
	first := times[0]
	count := func(from, to time.Time) int {
		i := sort.Search(len(times), func(k int) bool { return !times[k].Before(from) })
		j := sort.Search(len(times), func(k int) bool { return !times[k].Before(to) })
		return j - i
	}
	perSecond := map[int]int{}
	for _, ts := range times {
		perSecond[int(ts.Sub(first)/time.Second)]++
	}
	t.Logf("sends per second from the first: %v", perSecond)
	byTenant := map[string][6]int{}
	for _, m := range msgs {
		if sec := int(m.AcceptedAt.Sub(first) / time.Second); sec < 6 {
			v := byTenant[m.Tenant]
			v[sec]++
			byTenant[m.Tenant] = v
		}
	}
	t.Logf("sends per tenant in each of the first 6 s: %v", byTenant)
	worst := 0
	for _, t0 := range times {
		worst = max(worst, count(t0, t0.Add(time.Second)))
	}
	in20 := count(first, first.Add(20*time.Second))
	// One worker, then four: the same rate. One: seconds 2-12 after start.
	// Four: the 8 s from one second after B is done (B's end moves its share
	// to C and D, a transition of its own, not the workers' doing).
	one := float64(count(start.Add(2*time.Second), start.Add(12*time.Second))) / 10
	fourFrom := start.Add(14 * time.Second)
	if after := bDone.Add(time.Second); after.After(fourFrom) {
		fourFrom = after
	}
	four := float64(count(fourFrom, fourFrom.Add(8*time.Second))) / 8
	t.Logf("worst second %d sends; first 20 s %d; 1 worker %.1f/s, 4 workers %.1f/s; A %d; B %d of 200, done %s after start",
		worst, in20, one, four, aCount, bCount, bDone.Sub(start).Round(100*time.Millisecond))

	require.LessOrEqual(t, worst, 50+10, "a one-second window saw more than the rate plus the burst")
	require.InDelta(t, 1000, in20, 50, "20 s at 50/s, within 5%")
	require.InDelta(t, 50, one, 2.5, "one worker: the account's rate")
	require.InDelta(t, 50, four, 2.5, "four workers: the same rate")
	// Tenant A kept to its own allowance over the run (28 s, plus its burst).
	require.LessOrEqual(t, aCount, 5*28+1)
	// B competes with C and D (A takes its 5/s): its fair share of the
	// account is (50-5)/3 = 15/s, so its 200 need 13.3 s. The dispatcher
	// publishes every tenant's reminders interleaved, so B's first ones are
	// sent in the first second; B's deferred ones then wait behind the rest
	// of the 11,200 first deliveries in the queue (a few seconds for the one
	// worker; C and D use B's share meanwhile). Bound: 13.3 s + 6.7 s.
	// A's backlog alone would take 1,000 s at its 5/s.
	require.Equal(t, 200, bCount, "all of B delivered within the run")
	require.Less(t, bDone.Sub(start), 19*time.Second, "B done in time to measure four workers after it")
	require.Less(t, bDone.Sub(start), 20*time.Second, "B done at its fair share")
}
