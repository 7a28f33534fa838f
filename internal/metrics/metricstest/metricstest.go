// Package metricstest reads a registry the way a test asserts on it: every
// sample under one flat key, so a test says exactly which series it expects
// (and which it does not) without parsing the exposition format.
package metricstest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// Values gathers g into "name{label="value",...}" → value, labels in name
// order as Prometheus sorts them. A histogram gives its sample count under
// name_count{...} and its sum under name_sum{...}.
func Values(t testing.TB, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			suffix := ""
			if len(labels) > 0 {
				suffix = "{" + strings.Join(labels, ",") + "}"
			}
			name := mf.GetName()
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[name+suffix] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[name+suffix] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[name+"_count"+suffix] = float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"+suffix] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}
