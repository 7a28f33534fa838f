package ctl

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ops"
)

// Estimated counts (a large table, ops.Stats.Estimated) are marked ~ in both
// tables, with a line that says what is estimated and how to count exactly;
// exact counts print as before, unmarked.
func TestPrintStatsMarksEstimates(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC)
	st := &ops.Stats{Now: now,
		ByChannel: map[string]map[string]int64{"email": {"pending": 1000, "enqueued": 3, "delivered": 50}},
		ByTenant:  map[string]map[string]int64{"acme": {"pending": 1000, "enqueued": 3, "delivered": 50}}}
	var exact bytes.Buffer
	require.NoError(t, PrintStats(&exact, st, nil))
	require.NotContains(t, exact.String(), "~")

	st.Estimated = []string{"pending", "delivered", "failed", "expired", "canceled"}
	var est bytes.Buffer
	require.NoError(t, PrintStats(&est, st, nil))
	out := est.String()
	lines := strings.Split(out, "\n")
	require.Contains(t, lines[0], "pending")
	email := strings.Fields(lines[1])
	require.Equal(t, []string{"email", "~1000", "0", "3", "0", "0", "0", "~50", "~0", "~0", "~0", "~1053"}, email)
	require.Contains(t, out, "~ estimated: pending, delivered, failed, expired, canceled")
	require.Contains(t, out, "--exact counts every row")
	require.Regexp(t, `acme\s+~1000\s+0\s+3\s+0\s+0\s+0\s+~50\s+~0\s+~0\s+~0\s+~1053`, out)
}
