package console

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// The overview marks estimated counts ~ and says what is estimated, as
// nudgectl stats does; exact counts are shown as before.
func TestOverviewMarksEstimatedCounts(t *testing.T) {
	t.Parallel()
	tmpl, err := parseTemplates()
	require.NoError(t, err)
	now := time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC)
	render := func(st *ops.Stats) string {
		var buf bytes.Buffer
		zero := []int64{0} // an hour without a minute counted
		d := overviewData{Stats: st, Channels: reminder.Channels, States: reminder.States,
			Scheduled: zero, Claimed: zero, Started: zero, Terminal: zero, Quarantined: zero}
		require.NoError(t, tmpl["overview"].ExecuteTemplate(&buf, "layout", page{Title: "Overview", Nav: "overview", Now: now, Data: d}))
		return buf.String()
	}
	st := &ops.Stats{Now: now, ByChannel: map[string]map[string]int64{"email": {"pending": 1000, "enqueued": 3}}}
	exact := render(st)
	require.Contains(t, exact, ">1000</a>")
	require.NotContains(t, exact, "counts-estimated")

	st.Estimated = []string{"pending", "delivered", "failed", "expired", "canceled"}
	est := render(st)
	require.Contains(t, est, ">~1000</a>")
	require.Contains(t, est, ">3</a>", "the work is exact")
	require.Contains(t, est, `id="counts-estimated"`)
	require.Contains(t, est, "nudgectl stats --exact")
}
