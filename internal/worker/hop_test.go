package worker

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/metrics/metricstest"
	"github.com/nudgehq/nudge/internal/store"
)

// The attempt's hop (start → outcome recorded) is observed under the outcome
// it came to, so a dashboard can tell slow deliveries from slow failures
// (issue 17).
func TestStartToTerminalHopIsObservedUnderItsOutcome(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	reg := prometheus.NewRegistry()
	b.w.m = metrics.NewFor(reg, metrics.Worker, "sms")
	for id := int64(1); id <= 3; id++ {
		b.addRow(row(func(r *store.Delivery) { r.ID = id }))
	}
	b.sender.errs[2] = http400
	b.sender.errs[3] = http503

	b.w.process(context.Background(), []amqp.Delivery{
		b.delivery(t, 1, 1), // delivered
		b.delivery(t, 2, 2), // the provider refuses for good: failed
		b.delivery(t, 3, 3), // 503: retrying
	})

	vs := metricstest.Values(t, reg)
	hop := func(outcome string) float64 {
		k := `nudge_hop_latency_seconds_count{channel="sms",hop="start_to_terminal",outcome="` + outcome + `"}`
		require.Contains(t, vs, k)
		return vs[k]
	}
	got := map[string]float64{}
	for _, o := range metrics.HopOutcomes {
		got[o] = hop(o)
	}
	require.Equal(t, map[string]float64{"delivered": 1, "failed": 1, "retrying": 1, "expired": 0, "quarantined": 0}, got)
}
