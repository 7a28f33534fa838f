package intake_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// After the rollout (schema 44: lazy intake on, horizon 2 h), a reminder
// scheduled 3 h ahead through the public intake gets no state row until the
// promoter reaches it, and reads and changes as any pending reminder: Get,
// the operators' list and detail say pending at its due time, a duplicate
// converges on it, it can be rescheduled and canceled. One due in 30 minutes
// gets its state row at intake. Fails without 44 (every reminder gets its
// state row at intake).
func TestLazyIntakeOnAfterTheRollout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	var horizon time.Duration
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT horizon FROM nudge_lazy_intake`).Scan(&horizon))
	require.Equal(t, 2*time.Hour, horizon)
	now := time.Now().UTC().Truncate(time.Second)
	at := func(key string, d time.Duration) intake.Request {
		r := valid()
		r.Key, r.DueAt, r.Deadline = key, now.Add(d), now.Add(d+time.Hour)
		return r
	}
	schedule := func(r intake.Request) int64 {
		t.Helper()
		res, err := intake.Schedule(ctx, db.Pool, r)
		require.NoError(t, err)
		require.Equal(t, intake.Created, res.Status)
		return res.ID
	}
	hasState := func(id int64) bool {
		t.Helper()
		var ok bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM reminder_state WHERE id = $1)`, id).Scan(&ok))
		return ok
	}
	readsPending := func(id int64, due time.Time) {
		t.Helper()
		r, err := intake.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, reminder.Pending, r.State)
		require.True(t, due.Equal(r.DueAt), "due %s, want %s", r.DueAt, due)
		d, err := ops.ReadDetail(ctx, db.Pool, id)
		require.NoError(t, err)
		require.Equal(t, reminder.Pending, d.Item.State)
		require.True(t, due.Equal(d.Item.DueAt))
		page, err := ops.List(ctx, db.Pool, now, ops.Filter{States: []reminder.State{reminder.Pending}}, ops.Page{Size: 50})
		require.NoError(t, err)
		listed := false
		for _, it := range page.Items {
			listed = listed || it.ID == id
		}
		require.True(t, listed, "the operators' list of pending reminders shows %d", id)
	}

	far := at("far", 3*time.Hour)
	farID := schedule(far)
	require.False(t, hasState(farID), "due in 3 h: no state row at intake")
	readsPending(farID, far.DueAt)
	res, err := intake.Schedule(ctx, db.Pool, far)
	require.NoError(t, err)
	require.Equal(t, intake.Result{ID: farID, Status: intake.Exists}, res, "a duplicate converges on it")

	soon := at("soon", 30*time.Minute)
	soonID := schedule(soon)
	require.True(t, hasState(soonID), "due in 30 minutes: its state row at intake")
	readsPending(soonID, soon.DueAt)

	moved := at("moved", 3*time.Hour)
	movedID := schedule(moved)
	require.False(t, hasState(movedID))
	ch, err := intake.RescheduleTo(ctx, db.Pool, moved.Tenant, moved.Key, now.Add(5*time.Hour), now.Add(6*time.Hour), "test", "moved")
	require.NoError(t, err)
	require.Equal(t, intake.Changed, ch.Status)
	readsPending(movedID, now.Add(5*time.Hour))

	st, err := intake.Cancel(ctx, db.Pool, far.Tenant, far.Key, "test", "not needed")
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, st)
	r, err := intake.Get(ctx, db.Pool, farID)
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, r.State)
}
