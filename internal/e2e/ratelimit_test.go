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

// Four SMS worker processes share one provider account limited to 50/s
// (burst 10); tenant A may use 5/s, every other tenant 30/s. A has 5,000
// reminders due, C and D 3,000 each, and B 200 due at the same moment. What
// this slice guarantees: the limit is fleet-wide (four unshared limiters
// would allow four times the rate), never exceeded over the run, and A is
// held to its own allowance.
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
	start := time.Now()
	var workers []*testenv.Proc
	for range 4 {
		workers = append(workers, f.start(t, "sms-worker", f.env(), "--limits", limits, "--batch", "20"))
	}
	time.Sleep(25 * time.Second)
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
	// Every one-second window: at most the rate plus the burst.
	worst := 0
	for i, t0 := range times {
		j := sort.Search(len(times), func(k int) bool { return !times[k].Before(t0.Add(time.Second)) })
		worst = max(worst, j-i)
	}
	perSecond := map[int]int{}
	for _, ts := range times {
		perSecond[int(ts.Sub(first)/time.Second)]++
	}
	t.Logf("sends per second from the first: %v", perSecond)
	// Tokens are granted at most rate × window + burst (60) in any second;
	// what the provider sees can bunch by the grant-to-send time on a loaded
	// machine (seen here: up to 76; 100 allowed). The strict provider-side bound is the
	// next slice (acquire after the claim, right before the send); until then
	// this catches a limiter that is not fleet-wide (four workers unshared
	// would reach 240).
	require.LessOrEqual(t, worst, 100, "some second saw %d sends", worst)
	in20 := sort.Search(len(times), func(k int) bool { return !times[k].Before(first.Add(20 * time.Second)) })
	require.LessOrEqual(t, in20, 1000+10+50, "sends in the first 20 s: never above the rate")
	// Tenant A kept to its own allowance.
	require.LessOrEqual(t, aCount, 5*26+1)
	// Fairness between tenants that compete for the same account (B against
	// C and D) is not enforced yet: B's share varies from run to run (45 to
	// 200 of its 200 within the run here). Logged, not asserted, until the
	// next slice (docs/rate-limits.md, known gaps).
	require.Positive(t, bCount, "B is not starved outright")
	t.Logf("B delivered %d of 200", bCount)
	t.Logf("worst second %d sends; first 20 s %d sends; A %d; B done after %s", worst, in20, aCount,
		bDone.Sub(start).Round(100*time.Millisecond))
}
