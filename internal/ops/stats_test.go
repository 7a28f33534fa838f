package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/ops/opstest"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func TestReadStats(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)

	empty, err := ops.ReadStats(ctx, db.Pool, now)
	require.NoError(t, err)
	require.Nil(t, empty.OldestDue)
	require.Zero(t, empty.OldestDueAge())
	require.Empty(t, empty.Dispatch.Source, "nothing known about the dispatcher yet")

	ins := func(r opstest.Row) int64 { return opstest.Insert(t, db.Pool, r) }
	ins(opstest.Row{Key: "p1", DueAt: now.Add(-5 * time.Minute)})
	ins(opstest.Row{Key: "p2", DueAt: now.Add(time.Hour), Tenant: "globex"})
	ins(opstest.Row{Key: "e1", State: reminder.Enqueued, Since: now.Add(-2 * time.Minute), Channel: reminder.SMS})
	ins(opstest.Row{Key: "r1", State: reminder.Retrying, Since: now.Add(-time.Minute)})
	ins(opstest.Row{Key: "x1", State: reminder.Expired, Since: now.Add(-10 * time.Minute), Channel: reminder.SMS})
	ins(opstest.Row{Key: "x2", State: reminder.Expired, Since: now.Add(-3 * time.Hour), Channel: reminder.SMS})
	ins(opstest.Row{Key: "x3", State: reminder.Expired, Since: now.Add(-time.Minute), Reason: ops.ReasonPrefixDLQExpire + "poison"})
	q := ins(opstest.Row{Key: "q1", State: reminder.Quarantined})
	_, err = db.Pool.Exec(ctx, `INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, reason, at)
		VALUES ($1, 'enqueued', 'quarantined', 1, 'w', 'poison', $2), ($1, 'pending', 'quarantined', 3, 'w', 'poison', $3)`,
		q, now.Add(-20*time.Minute), now.Add(-5*time.Hour))
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, reason, at)
		VALUES (1, 'pending', 'leased', 1, 'dispatcher', 'claimed for dispatch', $1)`, now.Add(-40*time.Second))
	require.NoError(t, err)

	st, err := ops.ReadStats(ctx, db.Pool, now)
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"pending": 2, "retrying": 1, "expired": 1, "quarantined": 1}, st.ByChannel["email"])
	require.Equal(t, map[string]int64{"enqueued": 1, "expired": 2}, st.ByChannel["sms"])
	require.Equal(t, map[string]int64{"pending": 1}, st.ByTenant["globex"])
	require.Equal(t, map[string]int64{"pending": 1, "enqueued": 1, "retrying": 1, "expired": 3, "quarantined": 1}, st.ByTenant["acme"])
	require.Equal(t, 5*time.Minute, st.OldestDueAge())
	require.NotNil(t, st.NewestCreated)
	require.Equal(t, 2*time.Minute, st.Age(st.OldestEnqueued))
	require.Equal(t, time.Minute, st.Age(st.OldestRetryDue))
	require.Equal(t, ops.Window{Hour: 1, Day: 2}, st.DeadlineMisses["sms"])
	require.Equal(t, ops.Window{}, st.DeadlineMisses["email"], "an operator's expiry is not a deadline miss")
	require.Equal(t, ops.Window{Hour: 1, Day: 2}, st.Quarantined["email"])
	require.Equal(t, "events", st.Dispatch.Source, "no run recorded: the newest claim")
	require.Equal(t, 40*time.Second, st.CutoffLag())

	// From schema version 9 a claim is found by its code, whatever its reason
	// says; the reason text counts only on events without a code (above: one
	// of a dispatcher before version 9).
	_, err = db.Pool.Exec(ctx, `INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
		VALUES (1, 'pending', 'enqueued', 2, 'dispatcher', 'claimed', 'claimed, worded anew', $1),
		       (1, 'failed', 'pending', 3, 'bob', 'replayed', 'claimed for dispatch', $2)`,
		now.Add(-30*time.Second), now.Add(-10*time.Second))
	require.NoError(t, err)
	st, err = ops.ReadStats(ctx, db.Pool, now)
	require.NoError(t, err)
	require.Equal(t, 30*time.Second, st.CutoffLag(), "the newest event coded claimed")

	// A claim folded into its row (schema version 30), on a row in flight
	// and on one finished since, is a claim too.
	for _, c := range []struct {
		state reminder.State
		ago   time.Duration
	}{{reminder.Enqueued, 25 * time.Second}, {reminder.Expired, 20 * time.Second}} {
		_, err = db.Pool.Exec(ctx, `UPDATE reminder_state s SET claimed_at = $2, claimed_fence = s.fence, claimed_by = 'd'
			FROM reminders r WHERE r.id = s.id AND r.key = $1`, map[reminder.State]string{reminder.Enqueued: "e1", reminder.Expired: "x1"}[c.state],
			now.Add(-c.ago))
		require.NoError(t, err)
		st, err = ops.ReadStats(ctx, db.Pool, now)
		require.NoError(t, err)
		require.Equal(t, c.ago, st.CutoffLag(), "the newest claim, folded into an %s row", c.state)
	}

	require.NoError(t, dispatch.RecordRun(ctx, db.Pool, "d", dispatch.Summary{Cutoff: now.Add(-70 * time.Second)},
		now.Add(-69*time.Second), nil))
	st, err = ops.ReadStats(ctx, db.Pool, now)
	require.NoError(t, err)
	require.Equal(t, "dispatch_runs", st.Dispatch.Source)
	require.Equal(t, 70*time.Second, st.CutoffLag())
	require.EqualValues(t, 1, st.Dispatch.RunsLastDay)
}

// From a size on, nudgectl stats and the console count the work exactly and
// estimate the reminders scheduled for later and the terminal history from a
// sample of pages (issue 18). A sample of every page gives the exact counts:
// the bounded read's parts add up to StatsCounts', each reminder once (a
// lazy reminder materialized by a cancel is canceled, not also pending; one
// due without a state row is pending and due).
func TestReadStatsBoundedAddsUpToTheExactCounts(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	ins := func(r opstest.Row) int64 { return opstest.Insert(t, db.Pool, r) }
	ins(opstest.Row{Key: "due", DueAt: now.Add(-5 * time.Minute)})
	ins(opstest.Row{Key: "later", DueAt: now.Add(time.Hour), Tenant: "globex"})
	ins(opstest.Row{Key: "e", State: reminder.Enqueued, Channel: reminder.SMS})
	ins(opstest.Row{Key: "s", State: reminder.Sending, Since: now.Add(time.Minute)})
	ins(opstest.Row{Key: "r", State: reminder.Retrying})
	ins(opstest.Row{Key: "q", State: reminder.Quarantined, Tenant: "globex"})
	ins(opstest.Row{Key: "d", State: reminder.Delivered, Since: now.Add(-time.Hour)})
	ins(opstest.Row{Key: "x", State: reminder.Expired, Channel: reminder.SMS})
	canceled := ins(opstest.Row{Key: "c", State: reminder.Canceled, DueAt: now.Add(40 * 24 * time.Hour)})
	lateDue := ins(opstest.Row{Key: "u1", DueAt: now.Add(-2 * time.Hour)})
	farLater := ins(opstest.Row{Key: "u2", DueAt: now.Add(30 * 24 * time.Hour), Channel: reminder.SMS})
	db.Unpromote(t, lateDue, farLater)
	// A lazy reminder an operator canceled far ahead: materialized, canceled.
	_, err := db.Pool.Exec(ctx, `UPDATE reminders SET lazy = true WHERE id = $1`, canceled)
	require.NoError(t, err)

	exact, err := ops.ReadStatsWith(ctx, db.Pool, now, ops.StatsOptions{Exact: true})
	require.NoError(t, err)
	require.Nil(t, exact.Estimated)
	small, err := ops.ReadStats(ctx, db.Pool, now)
	require.NoError(t, err)
	require.Nil(t, small.Estimated, "a small table is counted exactly")
	require.Equal(t, exact.ByChannel, small.ByChannel)

	bounded, err := ops.ReadStatsWith(ctx, db.Pool, now, ops.StatsOptions{ExactUpToPages: 1, SamplePages: 1 << 20})
	require.NoError(t, err)
	require.Equal(t, []string{"pending", "delivered", "failed", "expired", "canceled"}, bounded.Estimated)
	require.True(t, bounded.IsEstimated("canceled"))
	require.False(t, bounded.IsEstimated("enqueued"))
	require.Equal(t, map[string]int64{"pending": 3, "sending": 1, "retrying": 1, "quarantined": 1, "delivered": 1, "canceled": 1},
		exact.ByChannel["email"])
	require.Equal(t, exact.ByChannel, bounded.ByChannel)
	require.Equal(t, exact.ByTenant, bounded.ByTenant)
	require.Equal(t, exact.OldestDueAge(), bounded.OldestDueAge())
}

// The estimate from a sample of a fraction of the pages is near the exact
// count, and the work is exact whatever the sample.
func TestReadStatsEstimatesFromASample(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	_, err := db.Pool.Exec(ctx, `INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key, lazy)
		SELECT 'tenant-' || i % 4, 'lazy:' || i, 'email', 'a@example.com', 't', '{}',
		       $1::timestamptz + interval '3 hours' + i * interval '1 minute',
		       $1::timestamptz + interval '4 hours' + i * interval '1 minute', 'lazy-' || i, true
		  FROM generate_series(1, 30000) i`, now)
	require.NoError(t, err)
	opstest.Insert(t, db.Pool, opstest.Row{Key: "e", State: reminder.Enqueued})
	var pages int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_relation_size('reminders') / 8192`).Scan(&pages))
	st, err := ops.ReadStatsWith(ctx, db.Pool, now, ops.StatsOptions{ExactUpToPages: 1, SamplePages: pages / 4})
	require.NoError(t, err)
	require.NotNil(t, st.Estimated)
	t.Logf("%d pages, a quarter sampled: pending %d of 30000", pages, st.ByChannel["email"]["pending"])
	require.InDelta(t, 30000, st.ByChannel["email"]["pending"], 3000)
	require.EqualValues(t, 1, st.ByChannel["email"]["enqueued"], "the work is exact")
}
