package intake_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// A reminder without a state row (due far ahead: the due-ordered store's
// promoter inserts it shortly before it is due, schema 39) is read and
// written as one that has it: these tests schedule two reminders alike but
// for their keys, delete the second's state row (testenv's Unpromote) and
// compare what every read and write gives for each.

// unpromotedPair schedules under prefix two reminders with a zone and a
// window, keys prefix+"p" and prefix+"u", and unpromotes the second.
func unpromotedPair(t *testing.T, db *testenv.DB, prefix string) (promoted, unpromoted intake.Request, ids [2]int64) {
	t.Helper()
	ctx := context.Background()
	w, err := localtime.ParseWindow("mon-fri 08:00-21:00")
	require.NoError(t, err)
	for i, suffix := range []string{"p", "u"} {
		r := valid()
		r.Key = prefix + suffix
		r.TZ = "Europe/Stockholm"
		r.Window = &w
		res, err := intake.Schedule(ctx, db.Pool, r)
		require.NoError(t, err)
		ids[i] = res.ID
		if i == 0 {
			promoted = r
		} else {
			unpromoted = r
		}
	}
	db.Unpromote(t, ids[1])
	return promoted, unpromoted, ids
}

// comparable blanks what differs between the two of a pair however they
// were written: ids, keys, idempotency keys and the clock's times.
func comparableReminder(r reminder.Reminder) reminder.Reminder {
	r.ID, r.Key, r.IdempotencyKey = 0, "", ""
	r.CreatedAt, r.UpdatedAt = time.Time{}, time.Time{}
	if r.FinishedAt != nil {
		r.FinishedAt = &time.Time{}
	}
	return r
}

func comparableEvents(evs []reminder.Event) []reminder.Event {
	out := make([]reminder.Event, len(evs))
	for i, e := range evs {
		e.ID, e.At = 0, time.Time{}
		out[i] = e
	}
	return out
}

// Get reads an unpromoted reminder as pending at fence 0 with no attempt,
// with the intent it was scheduled with, exactly as its promoted twin; its
// timeline is the 'scheduled' event.
func TestGetUnpromoted(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	_, req, ids := unpromotedPair(t, db, "get:")

	got, err := intake.Get(ctx, db.Pool, ids[1])
	require.NoError(t, err)
	require.Equal(t, reminder.Pending, got.State)
	require.Zero(t, got.Fence)
	require.Zero(t, got.Attempts)
	require.Equal(t, req.Key, got.Key)
	require.True(t, req.DueAt.Equal(got.DueAt), "due %s, want %s", got.DueAt, req.DueAt)
	require.True(t, req.Deadline.Equal(got.Deadline))
	require.Equal(t, "Europe/Stockholm", got.TZ)
	require.NotNil(t, got.Window)
	require.Equal(t, *req.Window, *got.Window)
	require.Equal(t, got.CreatedAt, got.UpdatedAt, "last changed when created")

	twin, err := intake.Get(ctx, db.Pool, ids[0])
	require.NoError(t, err)
	require.Equal(t, comparableReminder(twin), comparableReminder(got))
	byKey, err := intake.GetByKey(ctx, db.Pool, "acme", req.Key)
	require.NoError(t, err)
	require.Equal(t, got, byKey)

	evs, err := intake.Events(ctx, db.Pool, ids[1])
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, reminder.Pending, evs[0].To)
	require.Equal(t, reminder.Code("scheduled"), evs[0].Code)
}

// Scheduling an unpromoted reminder again converges on it when the content
// is the same (its wide row's intent compared, zone and window included) and
// is a conflict when it differs, as for a promoted one; nothing is written.
func TestScheduleManyComparesWithAnUnpromotedReminder(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	p, u, ids := unpromotedPair(t, db, "dup:")
	otherZone := u
	otherZone.TZ = "Europe/Oslo"
	otherDue := u
	otherDue.DueAt = u.DueAt.Add(time.Minute)
	noWindow := u
	noWindow.Window = nil
	for _, tc := range []struct {
		name string
		req  intake.Request
		same bool
	}{
		{"same", u, true},
		{"other zone", otherZone, false},
		{"other due time", otherDue, false},
		{"no window", noWindow, false},
	} {
		twin := tc.req
		twin.Key = p.Key
		out, err := intake.ScheduleMany(ctx, db.Pool, []intake.Request{twin, tc.req})
		require.NoError(t, err, tc.name)
		require.Len(t, out, 2)
		require.Equal(t, out[0].Status, out[1].Status, "%s: the same answer as for the promoted one", tc.name)
		if tc.same {
			require.Equal(t, intake.Exists, out[1].Status, tc.name)
			require.Equal(t, ids[1], out[1].ID, tc.name)
		} else {
			require.NotEqual(t, intake.Exists, out[1].Status, tc.name)
		}
	}
	var states int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_state WHERE id = $1`, ids[1]).Scan(&states))
	require.Zero(t, states, "comparing wrote no state row")
}

// CountPrefix counts an unpromoted reminder as open, as nudge_cancel_prefix
// would cancel it.
func TestCountPrefixCountsUnpromoted(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	unpromotedPair(t, db, "count:")
	n, err := intake.CountPrefix(ctx, db.Pool, "acme", "count:")
	require.NoError(t, err)
	require.Equal(t, intake.PrefixCount{Open: 2}, n)
	n, err = intake.CountPrefix(ctx, db.Pool, "acme", "count:u")
	require.NoError(t, err)
	require.Equal(t, intake.PrefixCount{Open: 1}, n)
}

// Every write to one reminder gives an unpromoted reminder the same answer,
// row and events as its promoted twin: the functions materialize the state
// row from the wide row first, then write as before.
func TestWritesToAnUnpromotedReminder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	later := due.Add(48 * time.Hour)
	other, err := localtime.ParseWindow("09:00-17:00")
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		write func(q intake.Querier, key string) (any, error)
	}{
		{"cancel", func(q intake.Querier, key string) (any, error) {
			return intake.Cancel(ctx, q, "acme", key, "test", "no longer needed")
		}},
		{"reschedule", func(q intake.Querier, key string) (any, error) {
			return intake.Reschedule(ctx, q, "acme", key, later, later.Add(time.Hour), "test", "moved")
		}},
		{"reschedule to", func(q intake.Querier, key string) (any, error) {
			c, err := intake.RescheduleTo(ctx, q, "acme", key, later, later.Add(time.Hour), "test", "moved")
			c.ID, c.Key = 0, ""
			return c, err
		}},
		{"reschedule to the same times", func(q intake.Querier, key string) (any, error) {
			c, err := intake.RescheduleTo(ctx, q, "acme", key, due, deadline, "test", "moved")
			c.ID, c.Key = 0, ""
			return c, err
		}},
		{"reschedule window", func(q intake.Querier, key string) (any, error) {
			c, err := intake.RescheduleWindow(ctx, q, "acme", key, due, deadline, &other, "test", "window")
			c.ID, c.Key = 0, ""
			return c, err
		}},
		{"update", func(q intake.Querier, key string) (any, error) {
			c, err := intake.Update(ctx, q, "acme", key, intake.Content{Recipient: "other@example.com"}, "test", "new")
			c.ID, c.Key = 0, ""
			return c, err
		}},
		{"update unchanged", func(q intake.Querier, key string) (any, error) {
			c, err := intake.Update(ctx, q, "acme", key, intake.Content{Template: "course-expiry"}, "test", "same")
			c.ID, c.Key = 0, ""
			return c, err
		}},
		{"cancel prefix", func(q intake.Querier, key string) (any, error) {
			cs, err := intake.CancelPrefix(ctx, q, "acme", key, 10, "test", "bulk")
			for i := range cs {
				cs[i].ID, cs[i].Key = 0, ""
			}
			return cs, err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := testenv.Postgres(t)
			p, u, ids := unpromotedPair(t, db, "w:")
			var got [2]any
			var rows [2]reminder.Reminder
			var evs [2][]reminder.Event
			for i, key := range []string{p.Key, u.Key} {
				res, err := tc.write(db.Pool, key)
				require.NoError(t, err)
				got[i] = res
				rows[i], err = intake.Get(ctx, db.Pool, ids[i])
				require.NoError(t, err)
				e, err := intake.Events(ctx, db.Pool, ids[i])
				require.NoError(t, err)
				evs[i] = comparableEvents(e)
			}
			require.Equal(t, got[0], got[1], "the answer")
			require.Equal(t, comparableReminder(rows[0]), comparableReminder(rows[1]), "the reminder afterwards")
			require.Equal(t, evs[0], evs[1], "the events")
			var states int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_state WHERE id = $1`, ids[1]).Scan(&states))
			require.Equal(t, 1, states, "the write materialized the state row")
		})
	}
}

// cancel prefix over a mix: the batch's unpromoted reminders are
// materialized and canceled in id order with the promoted ones, the limit
// counting both, and the rest are left without a state row.
func TestCancelPrefixMaterializesItsBatchOnly(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	var ids []int64
	for _, k := range []string{"a", "b", "c", "d"} {
		r := valid()
		r.Key = "mix:" + k
		res, err := intake.Schedule(ctx, db.Pool, r)
		require.NoError(t, err)
		ids = append(ids, res.ID)
	}
	db.Unpromote(t, ids[1], ids[3])
	cs, err := intake.CancelPrefix(ctx, db.Pool, "acme", "mix:", 3, "test", "bulk")
	require.NoError(t, err)
	require.Len(t, cs, 3)
	for i, c := range cs {
		require.Equal(t, ids[i], c.ID)
		require.Equal(t, intake.Changed, c.Status)
		require.Equal(t, reminder.Canceled, c.State)
	}
	var left []int64
	rows, err := db.Pool.Query(ctx, `SELECT r.id FROM reminders r WHERE NOT EXISTS
		(SELECT 1 FROM reminder_state s WHERE s.id = r.id) ORDER BY r.id`)
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		left = append(left, id)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []int64{ids[3]}, left, "only the batch was materialized")
	last, err := intake.Get(ctx, db.Pool, ids[3])
	require.NoError(t, err)
	require.Equal(t, reminder.Pending, last.State)
}

// A reminder materialized by a write and then canceled stays canceled when
// the promoter reaches it: the promotion inserts ON CONFLICT DO NOTHING.
func TestMaterializedThenCanceledStaysCanceled(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	_, u, ids := unpromotedPair(t, db, "mc:")
	st, err := intake.Cancel(ctx, db.Pool, "acme", u.Key, "test", "gone")
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, st)
	// The promoter's insert (docs/benchmarks.md, "The plan"), and a second
	// materialization: neither changes the row.
	_, err = db.Pool.Exec(ctx, `INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, tz, window_open,
			window_close, window_days)
		SELECT id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days
		  FROM reminders WHERE id = $1 ORDER BY due_at ON CONFLICT (id) DO NOTHING`, ids[1])
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `SELECT nudge_materialize($1)`, []int64{ids[1]})
	require.NoError(t, err)
	got, err := intake.Get(ctx, db.Pool, ids[1])
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, got.State)
	require.Equal(t, int64(1), got.Fence)
	require.Equal(t, "gone", got.Reason)
}
