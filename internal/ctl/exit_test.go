package ctl_test

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/ops/opstest"
)

// Issue 17: stats printed numbers and exited 0 whatever they said, and every
// failure exited 1. Now stats ends with a verdict and exits 6 when a
// runbook answer is bad, and each kind of failure has its status: 2 usage,
// 3 not found, 4 unreachable, 5 no schema (with "run nudgectl migrate").
func TestStatsVerdictAndExitCodes(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	ctx := context.Background()

	res := b.run("stats")
	require.Equal(t, ctl.ExitUnhealthy, ctl.ExitCode(res.err))
	require.Contains(t, res.stdout, "verdict: BAD")
	require.Regexp(t, `BAD\s+dispatcher runs\s+no dispatcher run recorded`, res.stdout)

	now := time.Now()
	require.NoError(t, dispatch.RecordRun(ctx, b.db.Pool, "d", dispatch.Summary{Cutoff: now}, now, nil))
	res = b.run("stats")
	require.NoError(t, res.err, res.stdout)
	require.Equal(t, ctl.ExitOK, ctl.ExitCode(res.err))
	require.Contains(t, res.stdout, "verdict: OK")

	opstest.Insert(t, b.db.Pool, opstest.Row{Key: "waiting", DueAt: now.Add(-10 * time.Minute)})
	res = b.run("stats")
	require.Equal(t, ctl.ExitUnhealthy, ctl.ExitCode(res.err))
	require.Regexp(t, `BAD\s+oldest due, pending\s+10m\d+s \(objective 5m0s\)`, res.stdout)
	res = b.run("stats", "--max-oldest-due", "1h")
	require.NoError(t, res.err, "within the operator's objective")

	res = b.run("stats", "--json")
	require.Equal(t, ctl.ExitUnhealthy, ctl.ExitCode(res.err))
	var rep ops.Report
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &rep))
	require.False(t, rep.Healthy)
	require.NotNil(t, rep.OldestDueAgeSeconds)
	require.InDelta(t, 600, *rep.OldestDueAgeSeconds, 30, "an age, not a timestamp")
	require.Nil(t, rep.OldestEnqueuedAgeSeconds, "nothing enqueued")
	require.NotNil(t, rep.Dispatch.CutoffLagSeconds)
	require.Equal(t, 300.0, rep.RecentWindowSeconds)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(res.stdout), &raw))
	require.NotContains(t, raw, "oldest_due", "no timestamps")

	// Usage, not found.
	require.Equal(t, ctl.ExitUsage, ctl.ExitCode(b.run("stats", "--max-oldest-due", "soon").err))
	require.Equal(t, ctl.ExitUsage, ctl.ExitCode(b.run("stats", "extra").err))
	require.Equal(t, ctl.ExitUsage, ctl.ExitCode(b.run("show", "abc").err))
	require.Equal(t, ctl.ExitUsage, ctl.ExitCode(b.run("show").err))
	require.Equal(t, ctl.ExitNotFound, ctl.ExitCode(b.run("show", "424242").err))
	require.Equal(t, ctl.ExitNotFound, ctl.ExitCode(b.run("cancel", "--tenant", "acme", "--key", "nope").err))

	// Unreachable: nothing listens there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "postgres://postgres@" + ln.Addr().String() + "/test?sslmode=disable"
	require.NoError(t, ln.Close())
	res = runCtl(t, closed, nil, "stats")
	require.Equal(t, ctl.ExitUnreachable, ctl.ExitCode(res.err), res.err)

	// No schema: a search path without Nudge's tables.
	empty := b.db.Schema + "_empty"
	_, err = b.db.Pool.Exec(ctx, "CREATE SCHEMA "+empty)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.db.Pool.Exec(context.Background(), "DROP SCHEMA "+empty+" CASCADE") })
	u, err := url.Parse(b.db.URL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", empty)
	u.RawQuery = q.Encode()
	res = runCtl(t, u.String(), nil, "stats")
	require.Equal(t, ctl.ExitSchema, ctl.ExitCode(res.err), res.err)
	require.ErrorContains(t, res.err, "run nudgectl migrate")
}
