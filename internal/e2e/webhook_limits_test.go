package e2e_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/webhook"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// arrivals is an application that answers 204 and notes when each request
// arrived.
type arrivals struct {
	mu    sync.Mutex
	times []time.Time
}

func (a *arrivals) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	a.times = append(a.times, time.Now())
	a.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (a *arrivals) sorted() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := slices.Clone(a.times)
	slices.SortFunc(out, func(x, y time.Time) int { return x.Compare(y) })
	return out
}

// Webhook rate limits per target host, fleet-wide (issue 16): the limits
// file gives host 127.0.0.1 4 requests a second (burst 2); localhost, not
// listed, shares the channel's generous account. Two webhook workers, each
// with its own limiter (their state shared in PostgreSQL), work 24 requests
// to the limited host and 60 to the other at once. Together they never send
// the limited host more than its rate plus its burst in any second, and the
// other host is not held to that pace.
func TestWebhookRateLimitPerTargetHost(t *testing.T) {
	t.Parallel()
	f := newSMSFleet(t)
	ctx := context.Background()
	const tenant, toLimited, toOther = "acme", 24, 60
	limits, err := ratelimit.Parse([]byte(`{"version": "hosts-1", "channels": {"webhook": {
		"account": "hooks", "rate": 500, "burst": 50, "hosts": {"127.0.0.1": {"rate": 4, "burst": 2}}}}}`))
	require.NoError(t, err)
	f.limits = &limits

	limited, other := &arrivals{}, &arrivals{}
	srvL, srvO := httptest.NewServer(limited), httptest.NewServer(other)
	t.Cleanup(srvL.Close)
	t.Cleanup(srvO.Close)
	otherURL := strings.Replace(srvO.URL, "127.0.0.1", "localhost", 1)
	targets, err := webhook.ParseTargets([]byte(`{"version": "e2e", "tenants": {"` + tenant + `": {
		"hosts": ["127.0.0.1", "localhost"], "allow_networks": ["127.0.0.1/32", "::1/128"], "allow_http": true}}}`))
	require.NoError(t, err)
	sender, err := webhook.New(webhook.Config{Targets: targets, Secrets: [][]byte{[]byte("0123456789abcdef0123456789abcdef")},
		Timeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(sender.Close)
	f.webhook = sender

	now := time.Now()
	var reqs []intake.Request
	for i := range toLimited + toOther {
		target := fmt.Sprintf("%s/drafts/%d", srvL.URL, i)
		if i >= toLimited {
			target = fmt.Sprintf("%s/drafts/%d", otherURL, i)
		}
		reqs = append(reqs, intake.Request{Tenant: tenant, Key: fmt.Sprint("cleanup-", i), Channel: reminder.Webhook,
			Recipient: target, Template: "draft-cleanup", DueAt: now.Add(-time.Minute), Deadline: now.Add(time.Hour)})
	}
	out, err := intake.ScheduleMany(ctx, f.db.Pool, reqs)
	require.NoError(t, err)
	for _, o := range out {
		require.NoError(t, o.Err)
	}

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 2 {
		f.startWorker(t, runCtx, reminder.Webhook, fmt.Sprint("webhook-", i), &wg)
	}
	d := f.dispatcher("dispatcher")
	start := time.Now()
	wg.Go(func() { _ = d.Loop(runCtx, 200*time.Millisecond) })
	f.waitTerminal(t, 2*time.Minute)
	stop()
	wg.Wait()

	var delivered int
	require.NoError(t, f.db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_state WHERE state = 'delivered'`).Scan(&delivered))
	require.Equal(t, toLimited+toOther, delivered)

	lt, ot := limited.sorted(), other.sorted()
	require.Len(t, lt, toLimited)
	require.Len(t, ot, toOther)
	most := 0
	for i := range lt {
		n := 0
		for _, x := range lt[i:] {
			if x.Sub(lt[i]) < time.Second {
				n++
			}
		}
		most = max(most, n)
	}
	require.LessOrEqual(t, most, 4+2, "the limited host saw at most rate + burst in any second, from both workers")
	spanL := lt[len(lt)-1].Sub(lt[0])
	require.GreaterOrEqual(t, spanL, time.Duration(float64(toLimited-2)/4*float64(time.Second))*8/10,
		"the limited host's requests were paced at its rate")
	doneO := ot[len(ot)-1].Sub(start)
	t.Logf("limited host: %d requests over %s (most in one second: %d); other host: %d done %s after the start",
		len(lt), spanL.Round(time.Millisecond), most, len(ot), doneO.Round(time.Millisecond))
	require.Less(t, doneO, spanL, "the other host was not held to the limited host's pace")
	require.Less(t, doneO, time.Duration(toOther/4)*time.Second/2, "the other host's requests went at well over 4/s")
}
