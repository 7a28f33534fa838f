package intake_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

var (
	due      = time.Date(2026, 8, 12, 9, 0, 0, 0, time.UTC)
	deadline = time.Date(2026, 8, 12, 23, 59, 0, 0, time.UTC)
)

func valid() intake.Request {
	return intake.Request{
		Tenant: "acme", Key: "course-expiry:learner-42:course-7:2026-08-12", Channel: reminder.Email,
		Recipient: "learner42@example.com", Template: "course-expiry",
		Data: map[string]any{"course": "Go 101"}, DueAt: due, Deadline: deadline,
	}
}

func TestScheduleIsIdempotentOnLogicalKey(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()

	first, err := intake.Schedule(ctx, db.Pool, valid())
	require.NoError(t, err)
	require.Equal(t, intake.Created, first.Status)

	again, err := intake.Schedule(ctx, db.Pool, valid())
	require.NoError(t, err)
	require.Equal(t, intake.Result{ID: first.ID, Status: intake.Exists}, again)

	changed := valid()
	changed.Recipient = "other@example.com"
	_, err = intake.Schedule(ctx, db.Pool, changed)
	var conflict *intake.ConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, first.ID, conflict.ID)
	require.Contains(t, err.Error(), valid().Key)

	r, err := intake.Get(ctx, db.Pool, first.ID)
	require.NoError(t, err)
	require.Equal(t, reminder.Pending, r.State)
	require.Equal(t, "learner42@example.com", r.Recipient)
	require.Regexp(t, `^nudge-[0-9a-f]{64}$`, r.IdempotencyKey)

	evs, err := intake.Events(ctx, db.Pool, first.ID)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, reminder.Pending, evs[0].To)
}

// The same table drives the Go API and the SQL function a web tier calls:
// both must refuse the same input naming the same field.
func TestValidationIsTheSameOnEveryPath(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()

	cases := []struct {
		name  string
		edit  func(*intake.Request)
		field string
	}{
		{"no tenant", func(r *intake.Request) { r.Tenant = " " }, "tenant"},
		{"no key", func(r *intake.Request) { r.Key = "" }, "key"},
		{"bad channel", func(r *intake.Request) { r.Channel = "fax" }, "channel"},
		{"no recipient", func(r *intake.Request) { r.Recipient = "" }, "recipient"},
		{"bad email", func(r *intake.Request) { r.Recipient = "not-an-address" }, "recipient"},
		{"bad phone", func(r *intake.Request) { r.Channel = reminder.SMS; r.Recipient = "555-1234" }, "recipient"},
		{"bad template", func(r *intake.Request) { r.Template = "../etc/passwd" }, "template"},
		{"data not object", func(r *intake.Request) { r.Data = []int{1, 2} }, "data"},
		{"no due_at", func(r *intake.Request) { r.DueAt = time.Time{} }, "due_at"},
		{"no deadline", func(r *intake.Request) { r.Deadline = time.Time{} }, "deadline"},
		{"deadline before due", func(r *intake.Request) { r.Deadline = r.DueAt.Add(-time.Minute) }, "deadline"},
	}
	for i, tc := range cases {
		req := valid()
		req.Key = req.Key + "-" + tc.name
		tc.edit(&req)

		_, err := intake.Schedule(ctx, db.Pool, req)
		var verr *intake.ValidationError
		require.ErrorAs(t, err, &verr, "case %d %s: Go API", i, tc.name)
		require.Equal(t, tc.field, verr.Field, "case %s: Go API", tc.name)
		require.NotEmpty(t, verr.Reason)

		data := "[1,2]"
		if tc.name != "data not object" {
			data = `{"course":"Go 101"}`
		}
		var due, dl any
		if !req.DueAt.IsZero() {
			due = req.DueAt
		}
		if !req.Deadline.IsZero() {
			dl = req.Deadline
		}
		var id int64
		err = db.Pool.QueryRow(ctx, `SELECT nudge_schedule($1, $2, $3, $4, $5, $6::jsonb, $7, $8)`,
			req.Tenant, req.Key, string(req.Channel), req.Recipient, req.Template, data, due, dl).Scan(&id)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "case %s: SQL function: %v", tc.name, err)
		require.Equal(t, "22023", pgErr.Code)
		require.Equal(t, tc.field, pgErr.ColumnName, "case %s: SQL function", tc.name)
		require.Contains(t, pgErr.Message, `field "`+tc.field+`"`)
	}
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminders`).Scan(&n))
	require.Zero(t, n, "nothing invalid may be stored")
}

func TestScheduleInsideCallersTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	res, err := intake.Schedule(ctx, tx, valid())
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	_, err = intake.Get(ctx, db.Pool, res.ID)
	require.ErrorIs(t, err, intake.ErrNotFound, "a rolled-back business change leaves no reminder")

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	res, err = intake.Schedule(ctx, tx, valid())
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	_, err = intake.Get(ctx, db.Pool, res.ID)
	require.NoError(t, err)
}

// Two transactions schedule the same key at once: the second waits for the
// first and then answers as if it had come after it: exists (same content),
// conflict (other content), or created (the first rolled back).
func TestScheduleWaitsForAConcurrentSchedulerOfTheSameKey(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	for _, c := range []struct {
		name      string
		other     string // the second request's recipient
		commit    bool
		want      intake.Status
		wantOther bool // a *ConflictError naming the first's id
	}{
		{"same content, committed", "learner42@example.com", true, intake.Exists, false},
		{"other content, committed", "someone@example.com", true, "", true},
		{"rolled back", "learner42@example.com", false, intake.Created, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			first := valid()
			first.Key = "concurrent:" + c.name
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			res1, err := intake.Schedule(ctx, tx, first)
			require.NoError(t, err)
			var firstPID int
			require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&firstPID))

			second := first
			second.Recipient = c.other
			type outcome struct {
				res intake.Result
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				res, err := intake.Schedule(ctx, db.Pool, second)
				done <- outcome{res, err}
			}()
			// The second waits for the first's transaction (the server
			// reports it blocked by the first's backend), not on a timer of
			// this test.
			require.Eventually(t, func() bool {
				var waiting int
				_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`,
					firstPID).Scan(&waiting)
				return waiting > 0
			}, 10*time.Second, 10*time.Millisecond, "the second Schedule does not wait for the first")
			select {
			case o := <-done:
				t.Fatalf("the second Schedule returned while the first was open: %+v", o)
			default:
			}
			if c.commit {
				require.NoError(t, tx.Commit(ctx))
			} else {
				require.NoError(t, tx.Rollback(ctx))
			}
			o := <-done
			if c.wantOther {
				var conflict *intake.ConflictError
				require.ErrorAs(t, o.err, &conflict)
				require.Equal(t, res1.ID, conflict.ID)
				return
			}
			require.NoError(t, o.err)
			require.Equal(t, c.want, o.res.Status)
			if c.commit {
				require.Equal(t, res1.ID, o.res.ID)
			} else {
				require.NotEqual(t, res1.ID, o.res.ID)
			}
		})
	}
}

func TestScheduleManyKeepsGoodRows(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()

	good := valid()
	bad := valid()
	bad.Key = "other"
	bad.Channel = "pigeon"
	dup := valid() // same key and content as good, later in the batch
	clash := valid()
	clash.Recipient = "someone-else@example.com" // same key, other content, same batch
	out, err := intake.ScheduleMany(ctx, db.Pool, []intake.Request{good, bad, dup, clash})
	require.NoError(t, err)
	var conflict *intake.ConflictError
	require.ErrorAs(t, out[3].Err, &conflict)
	require.Equal(t, out[0].ID, conflict.ID)
	r, err := intake.Get(ctx, db.Pool, out[0].ID)
	require.NoError(t, err)
	require.Equal(t, good.Recipient, r.Recipient, "the first occurrence in a batch wins")
	require.NoError(t, out[0].Err)
	require.Equal(t, intake.Created, out[0].Status)
	var verr *intake.ValidationError
	require.ErrorAs(t, out[1].Err, &verr)
	require.Equal(t, "channel", verr.Field)
	require.NoError(t, out[2].Err)
	require.Equal(t, intake.Result{ID: out[0].ID, Status: intake.Exists}, out[2].Result)
}

func TestCancel(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()

	res, err := intake.Schedule(ctx, db.Pool, valid())
	require.NoError(t, err)
	st, err := intake.Cancel(ctx, db.Pool, "acme", valid().Key, "test", "learner unsubscribed")
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, st)
	st, err = intake.Cancel(ctx, db.Pool, "acme", valid().Key, "test", "again")
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, st, "canceling twice is harmless")

	r, err := intake.Get(ctx, db.Pool, res.ID)
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, r.State)
	require.Equal(t, int64(1), r.Fence, "cancel fences out any message already queued")
	evs, err := intake.Events(ctx, db.Pool, res.ID)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	require.Equal(t, "learner unsubscribed", evs[1].Reason)

	_, err = intake.Cancel(ctx, db.Pool, "acme", "no-such-key", "test", "")
	require.ErrorIs(t, err, intake.ErrNotFound)
}
