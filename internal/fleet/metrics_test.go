package fleet_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/fleet"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// scrape GETs url and returns its samples: "name{labels}" → value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url) //nolint:gosec,noctx // a test's loopback URL
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		out[line[:i]] = v
	}
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// Issue 17: the dispatcher's metrics (its last success, the due → claim and
// claim → enqueue hops) existed only with --pushgateway, which nothing
// shipped sets. The dispatcher records them with its run; the reconciler,
// which Prometheus scrapes, exports them. A dispatcher run, then a scrape of
// the reconciler's /metrics over HTTP, finds them.
func TestDispatcherMetricsReachTheReconcilersEndpoint(t *testing.T) {
	t.Parallel()
	db, mq := testenv.Postgres(t), testenv.RabbitMQ(t)
	common := config.Common{DatabaseURL: db.URL, AMQPURL: mq.URL, SigningKeys: "test:0123456789abcdef0123",
		QueuePrefix: "t-" + testenv.RandomID(), LogLevel: "warn", LogFormat: "json", DeclareTopology: true}
	deleteTopology(t, mq.URL, common.Topology())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A run before the reconciler starts: its hops are not counted (they
	// happened before the reconciler's counters began).
	d := fleet.Dispatcher{Common: common}
	require.NoError(t, d.Run(ctx, fleet.Env{Log: zerolog.Nop(), Registry: prometheus.NewRegistry(), Clock: clock.Real{}}))

	addr := freeAddr(t)
	r := fleet.Reconciler{Common: common, Every: time.Hour, CleanEvery: time.Hour, Listen: addr}
	done := make(chan error, 1)
	go func() {
		done <- r.Run(ctx, fleet.Env{Log: zerolog.Nop(), Registry: probe.NewRegistry(), Clock: clock.Real{}})
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	url := "http://" + addr + "/metrics"
	require.Eventually(t, func() bool {
		resp, err := http.Get(url) //nolint:gosec,noctx // a test's loopback URL
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the reconciler serves /metrics")

	hop := func(h, ch string) string {
		return fmt.Sprintf(`nudge_hop_latency_seconds_count{channel=%q,hop=%q}`, ch, h)
	}
	before := scrape(t, url)
	for _, ch := range []string{"email", "sms"} {
		for _, h := range []string{"due_to_claim", "claim_to_enqueue"} {
			require.Contains(t, before, hop(h, ch), "every hop series is there before the first run")
			require.Zero(t, before[hop(h, ch)])
		}
	}
	require.Contains(t, before, "nudge_dispatch_last_success_timestamp_seconds", "the run before the start")
	require.Contains(t, before, `nudge_deadline_misses_total{channel="email"}`, "initialised at start")
	require.Contains(t, before, `nudge_lease_expirations_total{lease="send"}`, "initialised at start")
	require.NotContains(t, before, `nudge_deadline_misses_total{channel=""}`)

	now := time.Now()
	reqs := make([]intake.Request, 5)
	for i := range reqs {
		ch := reminder.Email
		if i >= 3 {
			ch = reminder.SMS
		}
		recipient := "a@example.com"
		if ch == reminder.SMS {
			recipient = "+14155550100"
		}
		reqs[i] = intake.Request{Tenant: "acme", Key: fmt.Sprintf("k-%d", i), Channel: ch, Recipient: recipient,
			Template: "t", DueAt: now.Add(-time.Minute), Deadline: now.Add(time.Hour)}
	}
	_, err := intake.ScheduleMany(ctx, db.Pool, reqs)
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, d.Run(ctx, fleet.Env{Log: zerolog.Nop(), Registry: prometheus.NewRegistry(), Clock: clock.Real{}}))

	after := scrape(t, url)
	require.Equal(t, 3.0, after[hop("due_to_claim", "email")])
	require.Equal(t, 2.0, after[hop("due_to_claim", "sms")])
	require.Equal(t, 3.0, after[hop("claim_to_enqueue", "email")])
	require.Equal(t, 2.0, after[hop("claim_to_enqueue", "sms")])
	require.GreaterOrEqual(t, after[`nudge_hop_latency_seconds_sum{channel="email",hop="due_to_claim"}`], 3*60.0,
		"each waited a minute past its due time")
	success := after["nudge_dispatch_last_success_timestamp_seconds"]
	require.GreaterOrEqual(t, success, float64(start.UnixNano())/1e9, "the new run's end")
	require.Equal(t, 1.0, after[`nudge_dispatch_runs_total{result="ok"}`], "one run since the start")
	require.Contains(t, after, "nudge_newest_reminder_age_seconds")
	require.Less(t, after["nudge_newest_reminder_age_seconds"], 60.0)

	again := scrape(t, url)
	require.Equal(t, 3.0, again[hop("due_to_claim", "email")], "a run is counted once")
}
