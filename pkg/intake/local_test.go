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
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/localtime/localtimetest"
	"github.com/nudgehq/nudge/pkg/reminder"
)

func window(t *testing.T, s string) *localtime.Window {
	t.Helper()
	w, err := localtime.ParseWindow(s)
	require.NoError(t, err)
	return &w
}

// stored reads a reminder's due time, deadline, zone and window.
func stored(t *testing.T, db *testenv.DB, id int64) reminder.Reminder {
	t.Helper()
	r, err := intake.Get(context.Background(), db.Pool, id)
	require.NoError(t, err)
	return r
}

// Local due times and deadlines across both daylight-saving transitions of
// Stockholm and New York and Lord Howe's half-hour ones resolve to the same
// instants through the Go API, nudge_try_schedule and nudge_schedule; a
// repeat is the same content, with another zone or window it is not.
func TestLocalTimesResolveAlikeOnEveryPath(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	for _, c := range localtimetest.DST {
		req := valid()
		req.Key = "go:" + c.Name
		req.DueAt, req.Deadline = time.Time{}, time.Time{}
		req.TZ, req.DueLocal, req.DeadlineLocal = c.Zone, c.DueLocal, c.DeadlineLocal
		req.Window = window(t, "mon-fri 08:00-21:00")
		res, err := intake.Schedule(ctx, db.Pool, req)
		require.NoError(t, err, c.Name)
		r := stored(t, db, res.ID)
		require.True(t, r.DueAt.Equal(c.WantDue), "%s Go: due %s, want %s", c.Name, r.DueAt, c.WantDue)
		require.True(t, r.Deadline.Equal(c.WantDeadline), "%s Go: deadline %s, want %s", c.Name, r.Deadline, c.WantDeadline)
		require.Equal(t, c.Zone, r.TZ)
		require.Equal(t, "mon-fri 08:00-21:00", r.Window.String())

		again, err := intake.Schedule(ctx, db.Pool, req)
		require.NoError(t, err)
		require.Equal(t, intake.Result{ID: res.ID, Status: intake.Exists}, again, "%s: a repeat is the same content", c.Name)
		instants := req
		instants.DueLocal, instants.DeadlineLocal, instants.DueAt, instants.Deadline = "", "", c.WantDue, c.WantDeadline
		again, err = intake.Schedule(ctx, db.Pool, instants)
		require.NoError(t, err)
		require.Equal(t, intake.Exists, again.Status, "%s: the same instants given as instants are the same content", c.Name)
		for _, edit := range []func(*intake.Request){
			func(r *intake.Request) { r.TZ = "Asia/Tokyo" },
			func(r *intake.Request) { r.Window = window(t, "08:00-21:00") },
			func(r *intake.Request) { r.Window = nil },
		} {
			other := instants
			edit(&other)
			_, err = intake.Schedule(ctx, db.Pool, other)
			var conflict *intake.ConflictError
			require.ErrorAs(t, err, &conflict, "%s: another zone or window is other content", c.Name)
		}

		var id int64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT nudge_schedule($1, $2, 'email', 'a@example.com', 'course-expiry',
			'{}', NULL, NULL, p_tz => $3, p_due_local => $4, p_deadline_local => $5,
			p_window_open => '08:00', p_window_close => '21:00', p_window_days => 62)`,
			"acme", "sql:"+c.Name, c.Zone, c.DueLocal, c.DeadlineLocal).Scan(&id))
		r = stored(t, db, id)
		require.True(t, r.DueAt.Equal(c.WantDue), "%s nudge_schedule: due %s, want %s", c.Name, r.DueAt, c.WantDue)
		require.True(t, r.Deadline.Equal(c.WantDeadline), "%s nudge_schedule: deadline %s", c.Name, r.Deadline)
		require.Equal(t, "mon-fri 08:00-21:00", r.Window.String(), "62 is Monday to Friday")

		var status string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT status FROM nudge_try_schedule($1, $2, 'email', 'a@example.com',
			'course-expiry', '{}', NULL, NULL, 'test', $3, $4, $5)`,
			"acme", "try:"+c.Name, c.Zone, c.DueLocal, c.DeadlineLocal).Scan(&status))
		require.Equal(t, "created", status)
		r, err = intake.GetByKey(ctx, db.Pool, "acme", "try:"+c.Name)
		require.NoError(t, err)
		require.True(t, r.DueAt.Equal(c.WantDue) && r.Deadline.Equal(c.WantDeadline), "%s nudge_try_schedule: %s / %s", c.Name, r.DueAt, r.Deadline)
		require.Nil(t, r.Window, "no window given: the tenant's policy applies")
	}
}

// The version-12 call of nudge_schedule, positional and with instants,
// still works and means UTC with the policy's window.
func TestScheduleCallOfEarlierVersionsStillWorks(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	var id int64
	require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT nudge_schedule('acme', 'old', 'email',
		'a@example.com', 'course-expiry', '{}', '2026-08-12T09:00:00Z', '2026-08-12T23:59:00Z')`).Scan(&id))
	r := stored(t, db, id)
	require.Empty(t, r.TZ)
	require.Nil(t, r.Window)
	require.True(t, r.DueAt.Equal(due))
}

// The local-time fields are refused alike by the Go API and the SQL
// function, naming the same field.
func TestLocalTimeValidationIsTheSameOnEveryPath(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	local := func(r *intake.Request) {
		r.DueAt, r.Deadline = time.Time{}, time.Time{}
		r.TZ, r.DueLocal, r.DeadlineLocal = "Europe/Stockholm", "2027-03-28T09:00", "2027-03-28T21:00"
	}
	cases := []struct {
		name  string
		edit  func(*intake.Request)
		field string
	}{
		{"unknown zone", func(r *intake.Request) { local(r); r.TZ = "Mars/Olympus_Mons" }, "tz"},
		{"abbreviation", func(r *intake.Request) { local(r); r.TZ = "CET" }, "tz"},
		{"local due without a zone", func(r *intake.Request) { local(r); r.TZ = "" }, "tz"},
		{"both due times", func(r *intake.Request) { local(r); r.DueAt = due }, "due_local"},
		{"both deadlines", func(r *intake.Request) { local(r); r.Deadline = deadline }, "deadline_local"},
		{"local deadline before the due time", func(r *intake.Request) { local(r); r.DeadlineLocal = "2027-03-28T08:00" }, "deadline"},
	}
	for _, tc := range cases {
		req := valid()
		req.Key += "-" + tc.name
		tc.edit(&req)
		_, err := intake.Schedule(ctx, db.Pool, req)
		var verr *intake.ValidationError
		require.ErrorAs(t, err, &verr, "%s: Go API", tc.name)
		require.Equal(t, tc.field, verr.Field, "%s: Go API: %v", tc.name, verr)

		args := []any{req.Tenant, req.Key, nil, nil, nil, nil, nil}
		if !req.DueAt.IsZero() {
			args[2] = req.DueAt
		}
		if !req.Deadline.IsZero() {
			args[3] = req.Deadline
		}
		for i, s := range []string{req.TZ, req.DueLocal, req.DeadlineLocal} {
			if s != "" {
				args[4+i] = s
			}
		}
		var id int64
		err = db.Pool.QueryRow(ctx, `SELECT nudge_schedule($1, $2, 'email', 'a@example.com', 'course-expiry', '{}',
			$3, $4, p_tz => $5, p_due_local => $6, p_deadline_local => $7)`, args...).Scan(&id)
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "%s: SQL function: %v", tc.name, err)
		require.Equal(t, "22023", pgErr.Code)
		require.Equal(t, tc.field, pgErr.ColumnName, "%s: SQL function: %s", tc.name, pgErr.Message)
	}
	// What only Go parses (a malformed wall time) is refused there, naming it.
	req := valid()
	local(&req)
	req.DueLocal = "2027-02-29T09:00"
	_, err := intake.Schedule(ctx, db.Pool, req)
	var verr *intake.ValidationError
	require.ErrorAs(t, err, &verr)
	require.Equal(t, "due_local", verr.Field)
	require.Contains(t, verr.Reason, "February 2027 has 28 days")
	// A window the SQL function cannot store.
	err = db.Pool.QueryRow(ctx, `SELECT nudge_schedule('acme', 'w', 'email', 'a@example.com', 'course-expiry', '{}',
		now(), now() + interval '1 hour', p_window_open => '08:00', p_window_close => '08:00')`).Scan(new(int64))
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, "window", pgErr.ColumnName)
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminders`).Scan(&n))
	require.Zero(t, n, "nothing invalid is stored")
}
