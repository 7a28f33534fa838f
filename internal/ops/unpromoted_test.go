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

// Only a filter that may select pending reminders walks reminders, where
// those without a state row are found.
func TestFilterIncludesPending(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f    ops.Filter
		want bool
	}{
		{ops.Filter{}, true},
		{ops.Filter{Tenant: "acme", Late: true}, true},
		{ops.Filter{States: []reminder.State{reminder.Pending}}, true},
		{ops.Filter{States: []reminder.State{reminder.Failed, reminder.Pending}}, true},
		{ops.Filter{States: []reminder.State{reminder.Failed, reminder.Quarantined}}, false},
		{ops.Filter{States: []reminder.State{reminder.Enqueued}, Late: true}, false},
	} {
		require.Equal(t, tc.want, tc.f.IncludesPending(), "%+v", tc.f)
	}
}

// An unpromoted reminder's row reads as pending at fence 0 with the wide
// row's intent, and a replay that names it explains it as pending, as for
// its promoted twin.
func TestReadsOfAnUnpromotedReminder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var items [2]ops.Item
	var replays [2]ops.ReplayResult
	for i, l := range layouts {
		b := setupListOf(t, l.unpromoted)
		d, err := ops.ReadDetail(ctx, b.db.Pool, b.ids["renewal-1"])
		require.NoError(t, err, l.name)
		require.Len(t, d.Events, 1, l.name)
		require.Equal(t, reminder.Pending, d.Item.State, l.name)
		require.Zero(t, d.Item.Fence, l.name)
		require.WithinDuration(t, b.now.Add(-time.Hour), d.Item.DueAt, time.Microsecond, l.name)
		require.WithinDuration(t, b.now.Add(23*time.Hour), d.Item.Deadline, time.Microsecond, l.name)
		items[i] = d.Item
		items[i].ID, items[i].CreatedAt, items[i].UpdatedAt = 0, time.Time{}, time.Time{}
		items[i].DueAt, items[i].Deadline = time.Time{}, time.Time{}
		dd := bulkDecision(true)
		replays[i], err = ops.Replay(ctx, b.db.Pool, b.now,
			ops.ReplaySelection{IDs: []int64{b.ids["renewal-1"]}, StuckFor: time.Minute}, dd)
		require.NoError(t, err, l.name)
		require.Equal(t, map[int64]reminder.State{b.ids["renewal-1"]: reminder.Pending}, replays[i].NotSelected, l.name)
		replays[i].NotSelected = nil
	}
	require.Equal(t, items[0], items[1])
	require.Equal(t, replays[0], replays[1])
}

// nudgectl stats counts a reminder without a state row as pending, and one
// due by now as the oldest due reminder (a lagging promoter shows as age),
// past its deadline as the oldest unexpired one.
func TestReadStatsCountsUnpromoted(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	ins := func(r opstest.Row) int64 { return opstest.Insert(t, db.Pool, r) }
	ins(opstest.Row{Key: "p1", DueAt: now.Add(-5 * time.Minute)})
	late := ins(opstest.Row{Key: "u1", DueAt: now.Add(-2 * time.Hour), Deadline: now.Add(-time.Hour)})
	later := ins(opstest.Row{Key: "u2", DueAt: now.Add(30 * 24 * time.Hour), Tenant: "globex", Channel: reminder.SMS})
	db.Unpromote(t, late, later)

	st, err := ops.ReadStats(ctx, db.Pool, now)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"pending": 2}, st.ByChannel["email"])
	require.Equal(t, map[string]int64{"pending": 1}, st.ByChannel["sms"])
	require.Equal(t, map[string]int64{"pending": 2}, st.ByTenant["acme"])
	require.Equal(t, map[string]int64{"pending": 1}, st.ByTenant["globex"])
	require.Equal(t, 2*time.Hour, st.OldestDueAge())
	require.Equal(t, time.Hour, st.Age(st.OldestUnexpired))
}
