package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/ops/opstest"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

type replayBundle struct {
	db  *testenv.DB
	now time.Time
	ids map[string]int64
}

// setupReplay inserts one reminder per situation a replay must judge, all
// due in the last hour unless said otherwise.
func setupReplay(t *testing.T) *replayBundle {
	t.Helper()
	b := &replayBundle{db: testenv.Postgres(t), now: time.Now().UTC(), ids: map[string]int64{}}
	due := b.now.Add(-30 * time.Minute)
	far := b.now.Add(24 * time.Hour)
	for key, r := range map[string]opstest.Row{
		"failed":          {State: reminder.Failed, Fence: 4, Attempts: 5, Republishes: 1, Reason: "attempts exhausted (5): http_503"},
		"quarantined":     {State: reminder.Quarantined, Fence: 3, Attempts: 2, Republishes: 4, Channel: reminder.SMS},
		"quarantined-due": {State: reminder.Quarantined, Fence: 3, Deadline: b.now.Add(2 * time.Minute)}, // inside the margin
		"failed-late":     {State: reminder.Failed, Fence: 4, Deadline: b.now.Add(-time.Minute), DueAt: b.now.Add(-40 * time.Minute)},
		"enqueued-stuck":  {State: reminder.Enqueued, Fence: 1, Since: b.now.Add(-20 * time.Minute)},
		"enqueued-fresh":  {State: reminder.Enqueued, Fence: 1, Since: b.now.Add(-time.Minute)},
		"retrying-stuck":  {State: reminder.Retrying, Fence: 2, Attempts: 1, Since: b.now.Add(-15 * time.Minute)},
		"leased-stuck":    {State: reminder.Leased, Fence: 1, Since: b.now.Add(-11 * time.Minute)},
		"delivered":       {State: reminder.Delivered, Fence: 2},
		"pending":         {State: reminder.Pending},
		"sending":         {State: reminder.Sending, Fence: 2, Since: b.now.Add(-time.Hour)},
		"canceled":        {State: reminder.Canceled, Fence: 1},
		"expired":         {State: reminder.Expired, Fence: 1},
		"other-tenant":    {State: reminder.Failed, Fence: 4, Tenant: "globex"},
		"outside-window":  {State: reminder.Failed, Fence: 4, DueAt: b.now.Add(-3 * time.Hour)},
	} {
		r.Key = key
		if r.DueAt.IsZero() {
			r.DueAt = due
		}
		if r.Deadline.IsZero() {
			r.Deadline = far
		}
		b.ids[key] = opstest.Insert(t, b.db.Pool, r)
	}
	return b
}

func (b *replayBundle) window() ops.ReplaySelection {
	from, to := b.now.Add(-time.Hour), b.now
	return ops.ReplaySelection{DueFrom: &from, DueTo: &to, StuckFor: 10 * time.Minute}
}

func decision(dry bool) ops.Decision {
	return ops.Decision{Actor: "alice", Reason: "provider outage 02:00-02:40", Attempts: ops.ResetAttempts,
		Margin: 5 * time.Minute, DryRun: dry}
}

func TestReplayWindow(t *testing.T) {
	t.Parallel()
	b := setupReplay(t)
	ctx := context.Background()
	sel := b.window()
	sel.Batch = 2 // several statements

	// Dry run first: the same verdicts, nothing written.
	before := opstest.Events(t, b.db.Pool, b.ids["failed"])
	dry, err := ops.Replay(ctx, b.db.Pool, b.now, sel, decision(true))
	require.NoError(t, err)
	require.True(t, dry.DryRun)
	require.Equal(t, 8, dry.Matched, "failed ×3 (one late, one another tenant's), quarantined ×2, three stuck")
	require.Equal(t, 6, dry.Replayed)
	require.Equal(t, 2, dry.RefusedDeadline)
	require.ElementsMatch(t, []int64{b.ids["quarantined-due"], b.ids["failed-late"]}, dry.Refused)
	require.Equal(t, map[reminder.State]int{reminder.Failed: 3, reminder.Quarantined: 2, reminder.Enqueued: 1,
		reminder.Retrying: 1, reminder.Leased: 1}, dry.ByState)
	st, fence, _ := opstest.State(t, b.db.Pool, b.ids["failed"])
	require.Equal(t, reminder.Failed, st)
	require.EqualValues(t, 4, fence)
	require.Equal(t, before, opstest.Events(t, b.db.Pool, b.ids["failed"]), "a dry run writes no event")

	res, err := ops.Replay(ctx, b.db.Pool, b.now, sel, decision(false))
	require.NoError(t, err)
	require.False(t, res.DryRun)
	require.Equal(t, dry.Matched, res.Matched)
	require.Equal(t, 6, res.Replayed)
	require.Equal(t, 2, res.RefusedDeadline)
	require.Zero(t, res.MovedOn)

	for key, from := range map[string]reminder.State{
		"failed": reminder.Failed, "quarantined": reminder.Quarantined, "other-tenant": reminder.Failed,
		"enqueued-stuck": reminder.Enqueued, "retrying-stuck": reminder.Retrying, "leased-stuck": reminder.Leased,
	} {
		id := b.ids[key]
		st, fence, attempts := opstest.State(t, b.db.Pool, id)
		require.Equal(t, reminder.Pending, st, key)
		require.Zero(t, attempts, "%s: attempts reset", key)
		ev := opstest.LastEvent(t, b.db.Pool, id)
		require.Equal(t, opstest.Event{From: from, To: reminder.Pending, Fence: fence, Actor: "alice",
			Reason: "replay: provider outage 02:00-02:40 [attempts reset]"}, ev, key)
	}
	var republishes int
	var reason, finished *string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT republishes, reason, finished_at::text FROM reminder_state WHERE id = $1`,
		b.ids["quarantined"]).Scan(&republishes, &reason, &finished))
	require.Zero(t, republishes, "the reconciler's republish budget is reset too")
	require.Nil(t, reason)
	require.Nil(t, finished)
	for _, key := range []string{"quarantined-due", "failed-late", "enqueued-fresh", "delivered", "pending", "sending",
		"canceled", "expired", "outside-window"} {
		evs := opstest.Events(t, b.db.Pool, b.ids[key])
		require.Len(t, evs, 1, "%s untouched (only its scheduled event)", key)
	}

	// Idempotent: the replayed reminders are pending now, not candidates.
	again, err := ops.Replay(ctx, b.db.Pool, b.now, sel, decision(false))
	require.NoError(t, err)
	require.Zero(t, again.Replayed)
	require.Equal(t, 2, again.RefusedDeadline, "the refused ones are refused again")
	require.Equal(t, 2, again.Matched)
}

func TestReplayFiltersAndExplicitIDs(t *testing.T) {
	t.Parallel()
	b := setupReplay(t)
	ctx := context.Background()

	sel := b.window()
	sel.Tenant, sel.Channel, sel.States = "acme", reminder.Email, []reminder.State{reminder.Failed}
	res, err := ops.Replay(ctx, b.db.Pool, b.now, sel, decision(true))
	require.NoError(t, err)
	require.Equal(t, 2, res.Matched, "acme's failed email reminders in the window: failed and failed-late")
	require.Equal(t, 1, res.Replayed)

	d := decision(false)
	d.Attempts = ops.KeepAttempts
	res, err = ops.Replay(ctx, b.db.Pool, b.now, ops.ReplaySelection{
		IDs:      []int64{b.ids["failed"], b.ids["delivered"], b.ids["pending"], b.ids["enqueued-fresh"], 999999},
		StuckFor: 10 * time.Minute,
	}, d)
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	require.Equal(t, map[int64]reminder.State{b.ids["delivered"]: reminder.Delivered, b.ids["pending"]: reminder.Pending,
		b.ids["enqueued-fresh"]: reminder.Enqueued, 999999: ""}, res.NotSelected)
	st, _, attempts := opstest.State(t, b.db.Pool, b.ids["failed"])
	require.Equal(t, reminder.Pending, st)
	require.Equal(t, 5, attempts, "attempts kept")
	require.Equal(t, "replay: provider outage 02:00-02:40 [attempts kept]", opstest.LastEvent(t, b.db.Pool, b.ids["failed"]).Reason)
}

// A reminder that moved between the read and the write is left alone.
func TestReplayIsFenced(t *testing.T) {
	t.Parallel()
	b := setupReplay(t)
	ctx := context.Background()
	// Retention purges the failed reminder's payload: it is refused.
	_, err := b.db.Pool.Exec(ctx, `UPDATE reminders SET data = '{}' WHERE id = $1`, b.ids["failed"])
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE reminder_state SET purged_at = now() WHERE id = $1`, b.ids["failed"])
	require.NoError(t, err)
	res, err := ops.Replay(ctx, b.db.Pool, b.now, ops.ReplaySelection{IDs: []int64{b.ids["failed"]}}, decision(false))
	require.NoError(t, err)
	require.Equal(t, 1, res.RefusedPurged)
	require.Zero(t, res.Replayed)
	st, _, _ := opstest.State(t, b.db.Pool, b.ids["failed"])
	require.Equal(t, reminder.Failed, st)
}

func TestReplayRefusesBadInput(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	now := time.Now()
	ok := ops.ReplaySelection{IDs: []int64{1}}
	for _, tc := range []struct {
		sel  ops.ReplaySelection
		d    ops.Decision
		want string
	}{
		{ops.ReplaySelection{}, decision(false), "name what to replay"},
		{ok, ops.Decision{Actor: "a", Attempts: ops.ResetAttempts}, "--reason is required"},
		{ok, ops.Decision{Reason: "r", Attempts: ops.ResetAttempts}, "--actor is required"},
		{ok, ops.Decision{Actor: "a", Reason: "r"}, "--attempts is required"},
		{ops.ReplaySelection{IDs: []int64{1}, States: []reminder.State{reminder.Delivered}}, decision(false),
			"--state delivered: a replay selects only failed, quarantined, leased, enqueued, retrying"},
		{ops.ReplaySelection{IDs: []int64{1}, Channel: "fax"}, decision(false), `--channel "fax"`},
		{ops.ReplaySelection{DueFrom: &now, DueTo: &now}, decision(false), "is not before --to"},
	} {
		_, err := ops.Replay(context.Background(), db.Pool, now, tc.sel, tc.d)
		require.ErrorContains(t, err, tc.want)
	}
}
