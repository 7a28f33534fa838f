package store_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// The happy path's events folded into the reminder row (schema version 30)
// against the statements of version 29, which stored every event: the
// timeline (reminder_timeline, read by intake.Events) must say the same,
// move for move, whichever version made each move (a rolling upgrade runs
// both side by side).

// v29 are internal/store's statements as schema version 29 ran them
// (git show faa2730:internal/store/queries.sql).
func v29(t *testing.T) sqlfile.Queries {
	t.Helper()
	src, err := os.ReadFile("testdata/queries_v29.sql")
	require.NoError(t, err)
	return sqlfile.Parse("testdata/queries_v29.sql", string(src))
}

// version runs the three happy-path moves as one version's binaries do.
type version struct {
	claim   func(t *testing.T, b bundle, now time.Time)
	attempt func(t *testing.T, b bundle, now time.Time, id int64) store.Attempt
	deliver func(t *testing.T, b bundle, now time.Time, a store.Attempt)
}

func newVersion() version {
	ctx := context.Background()
	return version{
		claim: func(t *testing.T, b bundle, now time.Time) {
			_, err := b.st.ClaimDue(ctx, now, now, 100, time.Minute, "d")
			require.NoError(t, err)
		},
		attempt: func(t *testing.T, b bundle, now time.Time, id int64) store.Attempt {
			_, got, err := b.st.ClaimForDelivery(ctx, now, reminder.Email, "", []store.Fenced{{ID: id, Fence: b.get(t, id).Fence}},
				time.Minute, "w")
			require.NoError(t, err)
			require.Contains(t, got, id)
			return got[id]
		},
		deliver: func(t *testing.T, b bundle, now time.Time, a store.Attempt) {
			moved, err := b.st.RecordOutcomes(ctx, now, []store.Outcome{{ReminderID: a.ReminderID, Fence: a.Fence,
				AttemptID: a.AttemptID, Code: reminder.CodeDelivered, Attempt: reminder.OutcomeDelivered}}, "w")
			require.NoError(t, err)
			require.True(t, moved[a.ReminderID])
		},
	}
}

func oldVersion(t *testing.T) version {
	ctx := context.Background()
	q := v29(t)
	exec := func(t *testing.T, b bundle, name string, args pgx.NamedArgs) {
		t.Helper()
		rows, err := b.db.Pool.Query(ctx, q.Get(name), args)
		require.NoError(t, err)
		rows.Close()
		require.NoError(t, rows.Err())
	}
	return version{
		claim: func(t *testing.T, b bundle, now time.Time) {
			exec(t, b, "ClaimDue", pgx.NamedArgs{"now": now, "cutoff": now, "limit": 100,
				"lease_until": now.Add(time.Minute), "actor": "d"})
		},
		attempt: func(t *testing.T, b bundle, now time.Time, id int64) store.Attempt {
			exec(t, b, "ClaimForDelivery", pgx.NamedArgs{"now": now, "channel": "email", "provider": "",
				"ids": []int64{id}, "fences": []int64{b.get(t, id).Fence}, "lease_until": now.Add(time.Minute), "actor": "w"})
			a := store.Attempt{ReminderID: id}
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT a.id, a.fence, a.attempt FROM delivery_attempts a
				WHERE a.reminder_id = $1 ORDER BY a.id DESC LIMIT 1`, id).Scan(&a.AttemptID, &a.Fence, &a.Number))
			return a
		},
		deliver: func(t *testing.T, b bundle, now time.Time, a store.Attempt) {
			args, err := store.OutcomeArgs(now, []store.Outcome{{ReminderID: a.ReminderID, Fence: a.Fence,
				AttemptID: a.AttemptID, Code: reminder.CodeDelivered, Attempt: reminder.OutcomeDelivered}}, "w")
			require.NoError(t, err)
			exec(t, b, "RecordOutcomes", args)
		},
	}
}

// move is what a timeline says of one event, without its row id.
type move struct {
	From, To reminder.State
	Fence    int64
	Actor    string
	Code     reminder.Code
	Reason   string
	At       time.Time
}

func (b bundle) timeline(t *testing.T, id int64) []move {
	t.Helper()
	evs, err := intake.Events(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	out := make([]move, len(evs))
	for i, e := range evs {
		out[i] = move{e.From, e.To, e.Fence, e.Actor, e.Code, e.Reason, e.At.UTC()}
	}
	return out
}

func (b bundle) storedEvents(t *testing.T, id int64) []reminder.Code {
	t.Helper()
	var codes []reminder.Code
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT coalesce(array_agg(code ORDER BY id), '{}') FROM reminder_events WHERE reminder_id = $1`, id).Scan(&codes))
	return codes
}

// happyPath schedules a reminder and takes it through claim, attempt and
// delivery, each move by the version given, at t0+1s, +2s, +3s (the same
// times for every reminder, so their timelines compare exactly).
func (b bundle) happyPath(t *testing.T, key string, claim, attempt, deliver version) int64 {
	t.Helper()
	id := b.schedule(t, key, t0.Add(-time.Minute), t0.Add(time.Hour))
	claim.claim(t, b, t0.Add(time.Second))
	a := attempt.attempt(t, b, t0.Add(2*time.Second), id)
	deliver.deliver(t, b, t0.Add(3*time.Second), a)
	require.Equal(t, reminder.Delivered, b.get(t, id).State)
	return id
}

func TestFoldedTimelineIsTheStoredOne(t *testing.T) {
	t.Parallel()
	b := setupBeforeRollout(t) // the version-29 statements run before the after-rollout step
	old, cur := oldVersion(t), newVersion()
	want := []move{
		{reminder.Pending, reminder.Enqueued, 1, "d", reminder.CodeClaimed, "claimed for dispatch", t0.Add(time.Second)},
		{reminder.Enqueued, reminder.Sending, 2, "w", reminder.CodeAttemptClaimed, "attempt 1 claimed", t0.Add(2 * time.Second)},
		{reminder.Sending, reminder.Delivered, 2, "w", reminder.CodeDelivered, "delivered", t0.Add(3 * time.Second)},
	}
	for _, c := range []struct {
		name                    string
		claim, attempt, deliver version
		stored                  []reminder.Code
	}{
		{"all version 29", old, old, old,
			[]reminder.Code{reminder.CodeScheduled, reminder.CodeClaimed, reminder.CodeAttemptClaimed, reminder.CodeDelivered}},
		{"all version 30", cur, cur, cur, []reminder.Code{reminder.CodeScheduled}},
		{"old dispatcher, new worker", old, cur, cur, []reminder.Code{reminder.CodeScheduled, reminder.CodeClaimed}},
		{"new dispatcher, old worker", cur, old, old,
			[]reminder.Code{reminder.CodeScheduled, reminder.CodeAttemptClaimed, reminder.CodeDelivered}},
		{"new worker's claim, old worker's outcome", cur, cur, old,
			[]reminder.Code{reminder.CodeScheduled, reminder.CodeDelivered}},
		{"old worker's claim, new worker's outcome", cur, old, cur,
			[]reminder.Code{reminder.CodeScheduled, reminder.CodeAttemptClaimed}},
	} {
		id := b.happyPath(t, c.name, c.claim, c.attempt, c.deliver)
		got := b.timeline(t, id)
		require.Len(t, got, 4, "%s: %v", c.name, got)
		require.Equal(t, reminder.CodeScheduled, got[0].Code, c.name)
		require.Equal(t, want, got[1:], "%s: each move once, in order, as version 29 stored it", c.name)
		require.Equal(t, c.stored, b.storedEvents(t, id), "%s: the events stored in reminder_events", c.name)
	}
}

// Off the happy path the claim and the attempt stay on the timeline once,
// in order, and every other move is stored as before.
func TestFoldedEventsOffTheHappyPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupBeforeRollout(t) // the version-29 statements run before the after-rollout step
	cur, old := newVersion(), oldVersion(t)
	codes := func(id int64) []string {
		var out []string
		for _, m := range b.timeline(t, id) {
			out = append(out, fmt.Sprintf("%s %d %s→%s", m.Code, m.Fence, m.From, m.To))
		}
		return out
	}

	// The worker dies mid-send: the reconciler republishes it (send lease
	// expired), a second attempt is claimed (stored: not the first) and
	// delivered (folded).
	died := b.schedule(t, "died", t0.Add(-time.Minute), t0.Add(time.Hour))
	cur.claim(t, b, t0)
	cur.attempt(t, b, t0.Add(time.Second), died)
	_, err := b.st.Reclaim(ctx, t0.Add(2*time.Minute), time.Minute, 10, time.Minute, "r")
	require.NoError(t, err)
	a := cur.attempt(t, b, t0.Add(3*time.Minute), died)
	require.Equal(t, 2, a.Number)
	cur.deliver(t, b, t0.Add(4*time.Minute), a)
	require.Equal(t, []string{"scheduled 0 →pending", "claimed 1 pending→enqueued", "attempt_claimed 2 enqueued→sending",
		"send_lease_expired 3 sending→enqueued", "attempt_claimed 4 enqueued→sending", "delivered 4 sending→delivered"},
		codes(died))

	// A claim whose message an old reconciler republishes, then whose
	// deadline passes while it waits: the new dispatcher's folded claim,
	// the old reconciler's stored republish, the expiry.
	late := b.schedule(t, "late", t0.Add(-time.Minute), t0.Add(10*time.Minute))
	cur.claim(t, b, t0.Add(5*time.Minute))
	rows, err := b.db.Pool.Query(ctx, v29(t).Get("Reclaim"), pgx.NamedArgs{"now": t0.Add(8 * time.Minute),
		"overdue_before": t0.Add(7 * time.Minute), "limit": 10, "lease_until": t0.Add(9 * time.Minute), "actor": "r",
		"max_republishes": store.MaxRepublishes, "waiting": []string{}})
	require.NoError(t, err)
	rows.Close()
	require.NoError(t, rows.Err())
	_, err = b.st.ExpireOverdue(ctx, t0.Add(11*time.Minute), 10, "r")
	require.NoError(t, err)
	require.Equal(t, []string{"scheduled 0 →pending", "claimed 1 pending→enqueued", "republished 2 enqueued→enqueued",
		"deadline_passed 3 enqueued→expired"}, codes(late))

	// Released (the publish was not confirmed), then claimed again: the
	// first claim folded, the second stored, the old dispatcher's first.
	for _, first := range []version{cur, old} {
		id := b.schedule(t, fmt.Sprintf("released-%p", first.claim), t0.Add(-time.Minute), t0.Add(time.Hour))
		first.claim(t, b, t0.Add(20*time.Minute))
		_, err := b.st.Release(ctx, t0.Add(20*time.Minute), []store.Fenced{{ID: id, Fence: b.get(t, id).Fence}}, "d", "not confirmed")
		require.NoError(t, err)
		cur.claim(t, b, t0.Add(21*time.Minute))
		cur.attempt(t, b, t0.Add(22*time.Minute), id)
		require.Equal(t, []string{"scheduled 0 →pending", "claimed 1 pending→enqueued",
			"publish_not_confirmed 2 enqueued→pending", "claimed 3 pending→enqueued", "attempt_claimed 4 enqueued→sending"},
			codes(id))
	}

	// Every move at the same instant (a frozen clock): the order still holds.
	frozen := b.schedule(t, "frozen", t0.Add(-time.Minute), t0.Add(time.Hour))
	at := t0.Add(30 * time.Minute)
	cur.claim(t, b, at)
	cur.deliver(t, b, at, cur.attempt(t, b, at, frozen))
	require.Equal(t, []string{"scheduled 0 →pending", "claimed 1 pending→enqueued", "attempt_claimed 2 enqueued→sending",
		"delivered 2 sending→delivered"}, codes(frozen))
}
