package ctl_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// After the rollout (schema 44, lazy intake on) a reminder nudgectl
// schedules 3 h ahead has no state row yet: nudgectl show reads it as
// pending at its due time, and nudgectl reschedule and cancel act on it.
// Fails without 44 (it gets its state row at intake).
func TestLazyReminderThroughNudgectl(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	due := time.Now().UTC().Add(3 * time.Hour).Truncate(time.Second)
	id := scheduleOne(t, b, "far", "--due-at", due.Format(time.RFC3339), "--deadline", due.Add(time.Hour).Format(time.RFC3339))
	var promoted bool
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM reminder_state WHERE id = $1)`, id).Scan(&promoted))
	require.False(t, promoted, "due in 3 h: no state row at intake")

	show := b.run("show", strconv.FormatInt(id, 10))
	require.NoError(t, show.err)
	require.Regexp(t, `(?m)^state\s+pending$`, show.stdout)
	require.Regexp(t, fmt.Sprintf(`(?m)^due at\s+%s$`, due.Format(time.RFC3339)), show.stdout)

	later := due.Add(time.Hour)
	res := b.run("reschedule", strconv.FormatInt(id, 10), "--due-at", later.Format(time.RFC3339),
		"--deadline", later.Add(time.Hour).Format(time.RFC3339))
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, fmt.Sprintf("reminder %d rescheduled", id))
	show = b.run("show", strconv.FormatInt(id, 10))
	require.NoError(t, show.err)
	require.Regexp(t, fmt.Sprintf(`(?m)^due at\s+%s$`, later.Format(time.RFC3339)), show.stdout)

	res = b.run("cancel", strconv.FormatInt(id, 10))
	require.NoError(t, res.err, res.stderr)
	show = b.run("show", strconv.FormatInt(id, 10))
	require.NoError(t, show.err)
	require.Regexp(t, `(?m)^state\s+canceled$`, show.stdout)
}
