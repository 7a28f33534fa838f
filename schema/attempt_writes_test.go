package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/retention"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Schema version 31 replaces the attempts' foreign key (its ON DELETE
// CASCADE) with a statement trigger: a reminder that retention deletes
// before its payload was purged (its attempts still there) takes its
// attempts with it, under the retention role, and nobody else's; and a
// reminder claimed, sent and recorded through the worker's statements keeps
// its attempt with the outcome.
func TestDeletedRemindersTakeTheirAttempts(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	deadline := b.now.Add(time.Hour)
	old1 := b.schedule(t, "acme", "old-1", deadline)
	old2 := b.schedule(t, "acme", "old-2", deadline)
	live := b.schedule(t, "acme", "live", deadline)

	// Each through a worker's claim and outcome: one attempt each.
	fenced := b.enqueue(t)
	var fs []store.Fenced
	for _, f := range fenced {
		fs = append(fs, f)
	}
	attempts, err := b.su.ClaimAttempts(ctx, b.now, fs, time.Minute, "w")
	require.NoError(t, err)
	require.Len(t, attempts, 3)
	var outs []store.Outcome
	for _, a := range attempts {
		outs = append(outs, store.Outcome{ReminderID: a.ReminderID, Fence: a.Fence, AttemptID: a.AttemptID,
			Code: reminder.CodeDelivered, Attempt: reminder.OutcomeDelivered, Reason: "delivered", ProviderID: "SM1"})
	}
	done, err := b.su.RecordOutcomes(ctx, b.now, outs, "w")
	require.NoError(t, err)
	require.Len(t, done, 3)
	require.Equal(t, 3, count(t, b.db.Pool, `SELECT 1 FROM delivery_attempts
		WHERE outcome = 'delivered' AND provider_message_id = 'SM1' AND finished_at IS NOT NULL`))

	// Two of them finished 40 days ago, past the reminder window (30 days)
	// and never purged (the deletion runs first in a pass).
	_, err = b.db.Pool.Exec(ctx, `UPDATE reminder_state SET finished_at = now() - interval '40 days'
		WHERE id = ANY($1)`, []int64{old1, old2})
	require.NoError(t, err)

	pool, _ := b.login(t, "nudge_retention")
	sum, err := retention.New(pool, retention.Config{}, clock.Real{}).Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), sum.RemindersDeleted)
	require.Zero(t, count(t, b.db.Pool, `SELECT 1 FROM delivery_attempts WHERE reminder_id = ANY($1)`,
		[]int64{old1, old2}), "the deleted reminders' attempts are gone")
	require.Equal(t, 1, count(t, b.db.Pool, `SELECT 1 FROM delivery_attempts WHERE reminder_id = $1`, live),
		"the remaining reminder's attempt is kept")

	// A plain DELETE (as any earlier release's retention runs it) too.
	_, err = b.db.Pool.Exec(ctx, `DELETE FROM reminders WHERE id = $1`, live)
	require.NoError(t, err)
	require.Zero(t, count(t, b.db.Pool, `SELECT 1 FROM delivery_attempts`))
}
