package worker_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/metrics/metricstest"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// On the real services: a worker with the defaults (window 16 messages, for
// envelopes of 50) that meets single messages starts a consumer with a wider
// window, and its /metrics say so: nudge_prefetch_windows_total counts the
// new consumer (as Counts.Windows, the "stopped" log line's
// prefetch_windows, does) and nudge_prefetch_window_messages reads the new
// window. 30 single messages move the estimate from 50 reminders per
// message to about 6: one step, to 400 / 12 = 33 messages, at the 23rd
// (the next, to 66, would take 34).
func TestANewPrefetchWindowIsExported(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	b.stop(t)
	reg := prometheus.NewRegistry()
	w := b.startWorkerWith(t, mustSMS(t, b), metrics.NewFor(reg, metrics.Worker, "sms"))

	const windows, window = `nudge_prefetch_windows_total{channel="sms"}`, `nudge_prefetch_window_messages{channel="sms"}`
	require.Eventually(t, func() bool { return metricstest.Values(t, reg)[window] == 16 }, 20*time.Second, 10*time.Millisecond,
		"the first consumer's window: 4 × Concurrency, above 400 / 50")
	vs := metricstest.Values(t, reg)
	require.Contains(t, vs, windows)
	require.Zero(t, vs[windows], "the first consumer of a session is not a new window")

	var ids []int64
	for i := range 30 {
		ids = append(ids, b.schedule(t, "single-"+strconv.Itoa(i), time.Hour))
	}
	b.disp.Config.EnvelopeSize = 1 // a message per reminder
	b.dispatch(t)
	for _, id := range ids {
		b.waitState(t, id, reminder.Delivered)
	}
	require.Eventually(t, func() bool { return w.Counts().Delivered == int64(len(ids)) }, 20*time.Second, 10*time.Millisecond)
	vs = metricstest.Values(t, reg)
	require.Equal(t, 1.0, vs[windows])
	require.Equal(t, 33.0, vs[window])
	require.Equal(t, int64(1), w.Counts().Windows, "the log line's prefetch_windows agrees")
}
