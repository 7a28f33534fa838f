package ops_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/ops/opstest"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

type listBundle struct {
	db  *testenv.DB
	now time.Time
	ids map[string]int64
}

// setupList inserts reminders that differ in one property each.
func setupList(t *testing.T) *listBundle {
	t.Helper()
	return setupListOf(t, false)
}

// layouts names the two ways a pending reminder can be stored: with its
// state row, and without one yet (due far ahead: the due-ordered store's
// promoter inserts it shortly before it is due, schema 39).
var layouts = []struct {
	name       string
	unpromoted bool
}{{"promoted", false}, {"unpromoted", true}}

// setupListOf is setupList, the pending reminders (renewal-1, course-1)
// without their state rows when unpromoted: every read and decision must
// see the same reminders either way.
func setupListOf(t *testing.T, unpromoted bool) *listBundle {
	t.Helper()
	b := &listBundle{db: testenv.Postgres(t), now: time.Now().UTC(), ids: map[string]int64{}}
	past, future := b.now.Add(-time.Hour), b.now.Add(time.Hour)
	for _, r := range []opstest.Row{
		{Key: "renewal-1", State: reminder.Pending, DueAt: past},
		{Key: "renewal-2", State: reminder.Enqueued, DueAt: past, Fence: 1},
		{Key: "renewal-3", State: reminder.Delivered, DueAt: past, Fence: 2},
		{Key: "course-1", State: reminder.Pending, DueAt: future},
		{Key: "course-2", State: reminder.Failed, DueAt: past, Fence: 3, Reason: "permanent: HTTP 400 bad number", Channel: reminder.SMS},
		{Key: "course-3", State: reminder.Quarantined, DueAt: past, Fence: 2, Tenant: "globex", Channel: reminder.SMS},
	} {
		b.ids[r.Key] = opstest.Insert(t, b.db.Pool, r)
	}
	if unpromoted {
		b.db.Unpromote(t, b.ids["renewal-1"], b.ids["course-1"])
	}
	return b
}

func (b *listBundle) keys(t *testing.T, f ops.Filter) []string {
	t.Helper()
	page, err := ops.List(context.Background(), b.db.Pool, b.now, f, ops.Page{})
	require.NoError(t, err)
	var out []string
	for _, it := range page.Items {
		out = append(out, it.Key)
	}
	require.Equal(t, ops.Count{N: len(out), Exact: true}, page.Count)
	return out
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			testListFilters(t, setupListOf(t, l.unpromoted))
		})
	}
}

func testListFilters(t *testing.T, b *listBundle) {
	hourAgo, soon, tomorrow := b.now.Add(-90*time.Minute), b.now.Add(-30*time.Minute), b.now.Add(23*time.Hour+30*time.Minute)
	for _, tc := range []struct {
		name string
		f    ops.Filter
		want []string
	}{
		{"everything, newest first", ops.Filter{}, []string{"course-3", "course-2", "course-1", "renewal-3", "renewal-2", "renewal-1"}},
		{"tenant", ops.Filter{Tenant: "globex"}, []string{"course-3"}},
		{"states", ops.Filter{States: []reminder.State{reminder.Pending, reminder.Failed}}, []string{"course-2", "course-1", "renewal-1"}},
		{"channel", ops.Filter{Channel: reminder.SMS}, []string{"course-3", "course-2"}},
		{"key prefix", ops.Filter{KeyPrefix: "renewal-"}, []string{"renewal-3", "renewal-2", "renewal-1"}},
		{"a whole key", ops.Filter{KeyPrefix: "course-1"}, []string{"course-1"}},
		{"due range", ops.Filter{DueFrom: &hourAgo, DueTo: &soon, Tenant: "acme"}, []string{"course-2", "renewal-3", "renewal-2", "renewal-1"}},
		{"deadline range", ops.Filter{DeadlineFrom: &b.now, DeadlineTo: &tomorrow}, []string{"course-3", "course-2", "renewal-3", "renewal-2", "renewal-1"}},
		{"late: past due, not terminal", ops.Filter{Late: true}, []string{"course-3", "renewal-2", "renewal-1"}},
		{"reason, any case", ops.Filter{Reason: "bad NUMBER"}, []string{"course-2"}},
		{"IDs", ops.Filter{IDs: []int64{b.ids["renewal-2"], b.ids["course-1"]}}, []string{"course-1", "renewal-2"}},
		{"a prefix with LIKE wildcards matches literally", ops.Filter{KeyPrefix: "renewal%"}, nil},
		{"pending", ops.Filter{States: []reminder.State{reminder.Pending}}, []string{"course-1", "renewal-1"}},
		{"pending and due", ops.Filter{States: []reminder.State{reminder.Pending}, DueTo: &b.now}, []string{"renewal-1"}},
		{"not pending", ops.Filter{States: []reminder.State{reminder.Enqueued, reminder.Delivered}}, []string{"renewal-3", "renewal-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, b.keys(t, tc.f))
		})
	}
}

func TestListPagesWithAKeysetCursor(t *testing.T) {
	t.Parallel()
	for _, l := range layouts {
		t.Run(l.name, func(t *testing.T) {
			t.Parallel()
			testListPages(t, setupListOf(t, l.unpromoted))
		})
	}
}

func testListPages(t *testing.T, b *listBundle) {
	ctx := context.Background()
	var got []string
	var p ops.Page
	p.Size = 4
	for i := 0; ; i++ {
		page, err := ops.List(ctx, b.db.Pool, b.now, ops.Filter{}, p)
		require.NoError(t, err)
		require.Equal(t, ops.Count{N: 6, Exact: true}, page.Count, "the count is the whole selection's")
		for _, it := range page.Items {
			got = append(got, it.Key)
		}
		if page.Next == 0 {
			break
		}
		require.Less(t, i, 2)
		p.Before = page.Next
	}
	require.Equal(t, []string{"course-3", "course-2", "course-1", "renewal-3", "renewal-2", "renewal-1"}, got)
}

func TestListRejectsBadFilters(t *testing.T) {
	t.Parallel()
	from, to := time.Now(), time.Now().Add(-time.Hour)
	for _, f := range []ops.Filter{
		{States: []reminder.State{"lost"}},
		{Channel: "pigeon"},
		{DueFrom: &from, DueTo: &to},
		{DeadlineFrom: &from, DeadlineTo: &to},
	} {
		_, err := ops.List(context.Background(), nil, time.Now(), f, ops.Page{})
		require.Error(t, err, "%+v", f)
	}
}

func TestCountIsBoundedBeyondTheCap(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO reminders (tenant, key, channel, recipient, template, due_at, deadline, idempotency_key)
		SELECT 'bulk', 'k-' || i, 'email', 'a@example.com', 't', now(), now() + interval '1 day', 'nudge-' || i
		  FROM generate_series(1, $1) AS i`, ops.CountCap+5)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO reminder_state (id, tenant, channel, due_at, deadline)
		SELECT id, tenant, channel, due_at, deadline FROM reminders`)
	require.NoError(t, err)
	c, err := ops.CountOf(ctx, db.Pool, time.Now(), ops.Filter{Tenant: "bulk"})
	require.NoError(t, err)
	require.Equal(t, ops.Count{N: ops.CountCap, Exact: false}, c)
	require.Equal(t, fmt.Sprintf("more than %d", ops.CountCap), c.String())
	c, err = ops.CountOf(ctx, db.Pool, time.Now(), ops.Filter{Tenant: "bulk", KeyPrefix: "k-1000"})
	require.NoError(t, err)
	require.Equal(t, ops.Count{N: 7, Exact: true}, c, "k-1000 and k-10000 … k-10005")
}

func TestReadDetail(t *testing.T) {
	t.Parallel()
	b := setupList(t)
	ctx := context.Background()
	id := b.ids["course-2"]
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO delivery_attempts (reminder_id, attempt, fence, worker, started_at, finished_at, outcome, error)
		VALUES ($1, 1, 3, 'sms-1', now(), now(), 'permanent', 'HTTP 400 bad number')`, id)
	require.NoError(t, err)
	d, err := ops.ReadDetail(ctx, b.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, "course-2", d.Item.Key)
	require.Equal(t, "+14155550100", d.Item.Recipient)
	require.Len(t, d.Events, 1)
	require.Len(t, d.Attempts, 1)
	require.Equal(t, "permanent", d.Attempts[0].Outcome)
	require.Empty(t, d.Item.TZ, "no zone without a tz column")

	_, err = ops.ReadDetail(ctx, b.db.Pool, id+1000)
	require.ErrorIs(t, err, ops.ErrNotFound)
}

func TestReadDetailShowsTheZoneWhenTheSchemaHasOne(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	// The column another migration adds; detected from the row, not required.
	_, err := db.Pool.Exec(ctx, `DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM information_schema.columns
		                WHERE table_schema = current_schema() AND table_name = 'reminders' AND column_name = 'tz') THEN
			ALTER TABLE reminders ADD COLUMN tz text;
		END IF; END $$`)
	require.NoError(t, err)
	id := opstest.Insert(t, db.Pool, opstest.Row{Key: "zoned"})
	_, err = db.Pool.Exec(ctx, `UPDATE reminder_state SET tz = 'Europe/Paris' WHERE id = $1`, id)
	require.NoError(t, err)
	d, err := ops.ReadDetail(ctx, db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, "Europe/Paris", d.Item.TZ)
}

func TestReadMinutes(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	now := time.Now().UTC()
	id := opstest.Insert(t, db.Pool, opstest.Row{Key: "m", Since: now.Add(-90 * time.Second)})
	_, err := db.Pool.Exec(ctx, `INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
		VALUES ($1, 'pending', 'enqueued', 1, 'd', 'claimed', 'claimed', $2),
		       ($1, 'enqueued', 'sending', 2, 'w', 'attempt_claimed', '', $2),
		       ($1, 'sending', 'delivered', 2, 'w', 'delivered', '', $3),
		       ($1, 'pending', 'enqueued', 1, 'd', 'claimed', 'too old', $4)`,
		id, now.Add(-30*time.Second), now.Add(-10*time.Second), now.Add(-2*time.Hour))
	require.NoError(t, err)
	ms, err := ops.ReadMinutes(ctx, db.Pool, now)
	require.NoError(t, err)
	require.Len(t, ms, 60)
	last, before := ms[59], ms[58]
	require.Equal(t, ops.Minute{Start: now.Add(-time.Minute), Claimed: 1, Started: 1, Terminal: 1}, last)
	require.Equal(t, int64(1), before.Scheduled)
	var total int64
	for _, m := range ms {
		total += m.Claimed
	}
	require.Equal(t, int64(1), total, "events older than an hour are not counted")

	// The same moves folded into rows (schema version 30): a delivered
	// reminder, one still sending, one enqueued; a claim of the previous
	// hour on a row delivered within this one is not counted.
	folded := func(key string, state reminder.State, claimed, started, delivered time.Time) {
		fid := opstest.Insert(t, db.Pool, opstest.Row{Key: key, State: state, Since: now.Add(-3 * time.Hour)})
		_, err := db.Pool.Exec(ctx, `UPDATE reminder_state SET claimed_at = $2, claimed_fence = 1, claimed_by = 'd',
			started_at = $3, started_fence = 2, started_by = 'w',
			delivered_by = CASE WHEN state = 'delivered' THEN 'w' END,
			finished_at = CASE WHEN state = 'delivered' THEN $4::timestamptz END WHERE id = $1`,
			fid, claimed, nullIfZero(started), delivered)
		require.NoError(t, err)
	}
	folded("fd", reminder.Delivered, now.Add(-30*time.Second), now.Add(-20*time.Second), now.Add(-10*time.Second))
	folded("fs", reminder.Sending, now.Add(-30*time.Second), now.Add(-20*time.Second), time.Time{})
	folded("fe", reminder.Enqueued, now.Add(-30*time.Second), time.Time{}, time.Time{})
	folded("fo", reminder.Delivered, now.Add(-2*time.Hour), now.Add(-20*time.Second), now.Add(-10*time.Second))
	ms, err = ops.ReadMinutes(ctx, db.Pool, now)
	require.NoError(t, err)
	require.Equal(t, ops.Minute{Start: now.Add(-time.Minute), Claimed: 4, Started: 4, Terminal: 3}, ms[59])
}

func nullIfZero(at time.Time) *time.Time {
	if at.IsZero() {
		return nil
	}
	return &at
}
