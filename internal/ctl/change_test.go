package ctl_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func TestRescheduleAndUpdate(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	ctx := context.Background()
	id := scheduleOne(t, b, "k")
	due, deadline := "2026-09-01T09:00:00Z", "2026-09-01T23:59:00Z"

	res := b.run("reschedule", "--tenant", "acme", "--key", "k", "--due-at", due, "--deadline", deadline,
		"--actor", "ops:alice", "--reason", "course moved")
	require.NoError(t, res.err)
	require.Contains(t, res.stdout, fmt.Sprintf("reminder %d rescheduled", id))
	res = b.run("reschedule", strconv.FormatInt(id, 10), "--due-at", due, "--deadline", deadline)
	require.NoError(t, res.err)
	require.Equal(t, fmt.Sprintf("reminder %d unchanged: it already is as asked\n", id), res.stdout)

	// A new send window with the same times is a change; "policy" clears it.
	res = b.run("reschedule", strconv.FormatInt(id, 10), "--due-at", due, "--deadline", deadline,
		"--window", "mon-fri 08:00-21:00")
	require.NoError(t, res.err, res.stderr)
	require.Contains(t, res.stdout, fmt.Sprintf("reminder %d rescheduled", id))
	r, err := intake.Get(ctx, b.db.Pool, id)
	require.NoError(t, err)
	require.NotNil(t, r.Window)
	require.Equal(t, "mon-fri 08:00-21:00", r.Window.String())
	res = b.run("reschedule", strconv.FormatInt(id, 10), "--due-at", due, "--deadline", deadline, "--window", "policy")
	require.NoError(t, res.err, res.stderr)
	r, err = intake.Get(ctx, b.db.Pool, id)
	require.NoError(t, err)
	require.Nil(t, r.Window)
	require.ErrorContains(t, b.run("reschedule", strconv.FormatInt(id, 10), "--due-at", due, "--deadline", deadline,
		"--window", "8-9pm").err, "--window")

	res = b.run("update", strconv.FormatInt(id, 10), "--recipient", "ada@example.org", "--data", `{"course":"Go 102"}`)
	require.NoError(t, res.err)
	require.Contains(t, res.stdout, fmt.Sprintf("reminder %d updated", id))
	r, err = intake.Get(ctx, b.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, "ada@example.org", r.Recipient)
	require.Equal(t, "course-expiry", r.Template)
	require.JSONEq(t, `{"course":"Go 102"}`, string(r.Data))
	require.Equal(t, due, r.DueAt.UTC().Format(time.RFC3339))
	show := b.run("show", strconv.FormatInt(id, 10))
	require.NoError(t, show.err)
	require.Regexp(t, `(?m)^\S+\s+pending\s+pending\s+1\s+ops:alice\s+course moved$`, show.stdout)
	require.Regexp(t, `(?m)^\S+\s+pending\s+pending\s+4\s+nudgectl:\S*\s+updated by operator$`, show.stdout)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"update", "--tenant", "acme", "--key", "k"}, "nothing to update"},
		{[]string{"update", "--tenant", "acme", "--key", "k", "--recipient", "+14155550100"}, "--recipient must be an email address"},
		{[]string{"update", "--tenant", "acme", "--key", "k", "--data", "[1]"}, "--data must be a JSON object"},
		{[]string{"update", "--tenant", "acme", "--key", "nope", "--template", "renewal"}, "not found"},
		{[]string{"reschedule", "--tenant", "acme", "--key", "k", "--due-at", due}, "--deadline is required"},
		{[]string{"reschedule", "--tenant", "acme", "--key", "k", "--due-at", deadline, "--deadline", due},
			"--deadline must be after due_at"},
	} {
		res := b.run(tc.args...)
		require.ErrorContains(t, res.err, tc.want, "%v", tc.args)
		require.Empty(t, res.stdout, "%v", tc.args)
	}

	require.NoError(t, b.run("cancel", strconv.FormatInt(id, 10)).err)
	res = b.run("update", strconv.FormatInt(id, 10), "--template", "renewal")
	require.ErrorContains(t, res.err, fmt.Sprintf("reminder %d already ended as canceled", id))
	res = b.run("reschedule", strconv.FormatInt(id, 10), "--due-at", "now", "--deadline", "now+1h")
	require.ErrorContains(t, res.err, "already ended as canceled")
}

func TestCancelByKeyPrefix(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	a1 := scheduleOne(t, b, "learner-42:course-7")
	a2 := scheduleOne(t, b, "learner-42:course-8")
	a3 := scheduleOne(t, b, "learner-42:course-9")
	keep := scheduleOne(t, b, "learner-420:course-7")
	other := scheduleOne(t, b, "learner-42:course-7", "--tenant", "globex")
	prefix := []string{"cancel", "--tenant", "acme", "--key-prefix", "learner-42:"}

	res := b.run(append(prefix, "--dry-run")...)
	require.NoError(t, res.err)
	require.Contains(t, res.stdout, "dry run: 3 open reminders of acme")
	res = b.run(prefix...)
	require.ErrorContains(t, res.err, "say why with --reason")

	res = b.run(append(prefix, "--reason", "eligibility ended", "--limit", "2")...)
	require.NoError(t, res.err)
	require.Equal(t, fmt.Sprintf("reminder %d learner-42:course-7 canceled\nreminder %d learner-42:course-8 canceled\n"+
		"2 canceled, 0 being sent\nthe limit (2) was reached: more may match; run again\n", a1, a2), res.stdout)
	res = b.run(append(prefix, "--reason", "eligibility ended", "--limit", "2")...)
	require.NoError(t, res.err)
	require.Equal(t, fmt.Sprintf("reminder %d learner-42:course-9 canceled\n1 canceled, 0 being sent\n", a3), res.stdout)
	res = b.run(append(prefix, "--reason", "eligibility ended")...)
	require.NoError(t, res.err)
	require.Equal(t, "0 canceled, 0 being sent\n", res.stdout)

	for _, id := range []int64{a1, a2, a3} {
		require.Equal(t, 1, countRows(t, b.db.Pool, `WHERE id = $1 AND state = 'canceled' AND reason = 'eligibility ended'`, id))
	}
	for _, id := range []int64{keep, other} {
		require.Equal(t, 1, countRows(t, b.db.Pool, `WHERE id = $1 AND state = $2`, id, reminder.Pending))
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cancel", "--key-prefix", "x", "--reason", "r"}, "--key-prefix needs --tenant"},
		{[]string{"cancel", "--tenant", "acme", "--key", "k", "--key-prefix", "x", "--reason", "r"}, "give no ID and no --key"},
		{[]string{"cancel", "1", "--tenant", "acme", "--key-prefix", "x", "--reason", "r"}, "give no ID and no --key"},
		{[]string{"cancel", "--tenant", "acme", "--key-prefix", "x", "--reason", "r", "--limit", "0"}, "--limit must be from 1"},
		{[]string{"cancel", "--tenant", "acme", "--key", "k", "--dry-run"}, "--dry-run goes with --key-prefix"},
	} {
		res := b.run(tc.args...)
		require.ErrorContains(t, res.err, tc.want, "%v", tc.args)
		require.Empty(t, res.stdout, "%v", tc.args)
	}
}
