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

func bulkDecision(dry bool) ops.Decision {
	return ops.Decision{Actor: "alice", Reason: "tenant offboarded", Attempts: ops.ResetAttempts, Margin: 5 * time.Minute, DryRun: dry}
}

// audits counts operator_audit rows of action by alice for reminder id.
func audits(t *testing.T, db *testenv.DB, action string, id int64) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM operator_audit WHERE actor = 'alice' AND action = $1 AND reminder_id = $2`, action, id).Scan(&n))
	return n
}

func TestBulkCancel(t *testing.T) {
	t.Parallel()
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			testBulkCancel(t, setupListOf(t, l.unpromoted))
		})
	}
}

func testBulkCancel(t *testing.T, b *listBundle) {
	ctx := context.Background()
	f := ops.Filter{KeyPrefix: "renewal-"}

	dry, err := ops.Bulk(ctx, b.db.Pool, b.now, ops.BulkCancel, f, bulkDecision(true), ops.BulkOptions{})
	require.NoError(t, err)
	require.Equal(t, 3, dry.Selected)
	require.Equal(t, 2, dry.Changed, "pending and enqueued would be canceled")
	require.Equal(t, map[string]int{"already delivered": 1}, dry.Skipped)
	st, _, _ := opstest.State(t, b.db.Pool, b.ids["renewal-1"])
	require.Equal(t, reminder.Pending, st, "a dry run changes nothing")

	var progress []int
	res, err := ops.Bulk(ctx, b.db.Pool, b.now, ops.BulkCancel, f, bulkDecision(false),
		ops.BulkOptions{Progress: func(done, total int) { progress = append(progress, done*10+total) }})
	require.NoError(t, err)
	require.Equal(t, 2, res.Changed)
	require.Equal(t, []int{13, 23, 33}, progress)
	for _, k := range []string{"renewal-1", "renewal-2"} {
		st, _, _ := opstest.State(t, b.db.Pool, b.ids[k])
		require.Equal(t, reminder.Canceled, st, k)
		ev := opstest.LastEvent(t, b.db.Pool, b.ids[k])
		require.Equal(t, "alice", ev.Actor)
		require.Equal(t, "bulk cancel: tenant offboarded", ev.Reason)
		require.Equal(t, 1, audits(t, b.db, "bulk.cancel", b.ids[k]), k)
	}
	require.Zero(t, audits(t, b.db, "bulk.cancel", b.ids["renewal-3"]), "nothing changed, nothing audited")

	again, err := ops.Bulk(ctx, b.db.Pool, b.now, ops.BulkCancel, f, bulkDecision(false), ops.BulkOptions{})
	require.NoError(t, err)
	require.Zero(t, again.Changed, "a second run changes nothing")
}

func TestBulkReplayAndExpire(t *testing.T) {
	t.Parallel()
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			testBulkReplayAndExpire(t, setupListOf(t, l.unpromoted))
		})
	}
}

func testBulkReplayAndExpire(t *testing.T, b *listBundle) {
	ctx := context.Background()
	f := ops.Filter{States: []reminder.State{reminder.Failed, reminder.Quarantined, reminder.Pending}}

	dry, err := ops.Bulk(ctx, b.db.Pool, b.now, ops.BulkReplay, f, bulkDecision(true), ops.BulkOptions{})
	require.NoError(t, err)
	require.Equal(t, 4, dry.Selected)
	require.Equal(t, 2, dry.Changed, "the failed and the quarantined one")
	require.Equal(t, 2, dry.Skipped["pending (not replayable, or not stuck yet)"])

	res, err := ops.Bulk(ctx, b.db.Pool, b.now, ops.BulkReplay, ops.Filter{Channel: reminder.SMS, Tenant: "acme"}, bulkDecision(false), ops.BulkOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, res.Changed)
	st, _, _ := opstest.State(t, b.db.Pool, b.ids["course-2"])
	require.Equal(t, reminder.Pending, st)
	require.Equal(t, "replay: [bulk] tenant offboarded [attempts reset]", opstest.LastEvent(t, b.db.Pool, b.ids["course-2"]).Reason)
	require.Equal(t, 1, audits(t, b.db, "bulk.replay", b.ids["course-2"]))

	exp, err := ops.Bulk(ctx, b.db.Pool, b.now, ops.BulkExpire, ops.Filter{Channel: reminder.SMS}, bulkDecision(false), ops.BulkOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, exp.Changed, "only the quarantined one")
	require.Equal(t, 1, exp.Skipped["pending (only quarantined reminders are expired; cancel the others)"])
	st, _, _ = opstest.State(t, b.db.Pool, b.ids["course-3"])
	require.Equal(t, reminder.Expired, st)
	require.Equal(t, 1, audits(t, b.db, "bulk.expire", b.ids["course-3"]))
}

func TestBulkRefuses(t *testing.T) {
	t.Parallel()
	b := setupList(t)
	ctx := context.Background()
	_, err := ops.Bulk(ctx, b.db.Pool, b.now, ops.BulkCancel, ops.Filter{}, bulkDecision(false), ops.BulkOptions{})
	require.ErrorIs(t, err, ops.ErrBulkNoFilter)
	_, err = ops.Bulk(ctx, b.db.Pool, b.now, ops.BulkCancel, ops.Filter{Tenant: "acme"}, bulkDecision(false), ops.BulkOptions{Max: 2})
	require.ErrorIs(t, err, ops.ErrBulkTooLarge)
	d := bulkDecision(false)
	d.Reason = " "
	_, err = ops.Bulk(ctx, b.db.Pool, b.now, ops.BulkCancel, ops.Filter{Tenant: "acme"}, d, ops.BulkOptions{})
	require.ErrorIs(t, err, ops.ErrNoReason)
	_, err = ops.Bulk(ctx, b.db.Pool, b.now, "delete", ops.Filter{Tenant: "acme"}, bulkDecision(false), ops.BulkOptions{})
	require.Error(t, err)
}
