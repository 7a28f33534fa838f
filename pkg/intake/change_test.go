package intake_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Every bad piece of new content is a *ValidationError naming its field,
// whether Go refuses it (what PostgreSQL cannot hold) or nudge_invalid does,
// and nothing changes.
func TestUpdateRefusesInvalidContent(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	res, err := intake.Schedule(ctx, db.Pool, valid())
	require.NoError(t, err)
	for _, tc := range []struct {
		name    string
		content intake.Content
		field   string
	}{
		{"NUL in recipient", intake.Content{Recipient: "a\x00@example.com"}, "recipient"},
		{"invalid UTF-8 template", intake.Content{Template: "\xff"}, "template"},
		{"data not an object", intake.Content{Data: []int{1}}, "data"},
		{"data raw array", intake.Content{Data: json.RawMessage(`[1]`)}, "data"},
		{"phone on email", intake.Content{Recipient: "+14155550100"}, "recipient"},
		{"bad template", intake.Content{Template: "Course Expiry"}, "template"},
		{"long recipient", intake.Content{Recipient: strings.Repeat("a", 250) + "@example.com"}, "recipient"},
	} {
		_, err := intake.Update(ctx, db.Pool, "acme", valid().Key, tc.content, "test", "")
		var verr *intake.ValidationError
		require.ErrorAs(t, err, &verr, tc.name)
		require.Equal(t, tc.field, verr.Field, tc.name)
		require.NotEmpty(t, verr.Reason, tc.name)
	}
	r, err := intake.Get(ctx, db.Pool, res.ID)
	require.NoError(t, err)
	require.Equal(t, valid().Recipient, r.Recipient)
	require.Zero(t, r.Fence, "nothing was written")

	// An empty map replaces the data; nil keeps it.
	c, err := intake.Update(ctx, db.Pool, "acme", valid().Key, intake.Content{Data: map[string]any{}}, "test", "")
	require.NoError(t, err)
	require.Equal(t, intake.Changed, c.Status)
	c, err = intake.Update(ctx, db.Pool, "acme", valid().Key, intake.Content{Template: "course-expiry"}, "test", "")
	require.NoError(t, err)
	require.Equal(t, intake.Unchanged, c.Status)
	r, err = intake.Get(ctx, db.Pool, res.ID)
	require.NoError(t, err)
	require.JSONEq(t, `{}`, string(r.Data))
}

func TestRescheduleToAnswersEveryCase(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	res, err := intake.Schedule(ctx, db.Pool, valid())
	require.NoError(t, err)
	key := valid().Key

	c, err := intake.RescheduleTo(ctx, db.Pool, "acme", key, due, deadline, "test", "")
	require.NoError(t, err)
	require.Equal(t, intake.Change{ID: res.ID, Key: key, Status: intake.Unchanged, State: reminder.Pending}, c)
	c, err = intake.RescheduleTo(ctx, db.Pool, "acme", key, due.Add(time.Hour), deadline.Add(time.Hour), "test", "")
	require.NoError(t, err)
	require.Equal(t, intake.Changed, c.Status)
	c, err = intake.RescheduleTo(ctx, db.Pool, "acme", "nope", due, deadline, "test", "")
	require.NoError(t, err)
	require.Equal(t, intake.Change{Key: "nope", Status: intake.NotFound}, c)
	_, err = intake.RescheduleTo(ctx, db.Pool, "acme", key, due, due, "test", "")
	var verr *intake.ValidationError
	require.ErrorAs(t, err, &verr)
	require.Equal(t, "deadline", verr.Field)
	require.Equal(t, "must be after due_at", verr.Reason)
}

// Issue 14: reschedule with a new send window (and back to the tenant's
// policy with none), unchanged when asked for what it already has.
func TestRescheduleWindowSetsAndClearsTheWindow(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	res, err := intake.Schedule(ctx, db.Pool, valid())
	require.NoError(t, err)
	key := valid().Key
	weekdays, err := localtime.ParseWindow("mon-fri 08:00-21:00")
	require.NoError(t, err)

	c, err := intake.RescheduleWindow(ctx, db.Pool, "acme", key, due, deadline, &weekdays, "test", "quiet hours")
	require.NoError(t, err)
	require.Equal(t, intake.Change{ID: res.ID, Key: key, Status: intake.Changed, State: reminder.Pending}, c)
	r, err := intake.Get(ctx, db.Pool, res.ID)
	require.NoError(t, err)
	require.NotNil(t, r.Window)
	require.Equal(t, weekdays.String(), r.Window.String())

	c, err = intake.RescheduleWindow(ctx, db.Pool, "acme", key, due, deadline, &weekdays, "test", "again")
	require.NoError(t, err)
	require.Equal(t, intake.Unchanged, c.Status, "the same times and window")

	c, err = intake.RescheduleWindow(ctx, db.Pool, "acme", key, due, deadline, nil, "test", "policy")
	require.NoError(t, err)
	require.Equal(t, intake.Changed, c.Status)
	r, err = intake.Get(ctx, db.Pool, res.ID)
	require.NoError(t, err)
	require.Nil(t, r.Window, "no window of its own: the tenant's policy applies")
	require.Equal(t, reminder.CodeRescheduled, lastCode(t, ctx, db, res.ID))
}

func lastCode(t *testing.T, ctx context.Context, db *testenv.DB, id int64) reminder.Code {
	t.Helper()
	evs, err := intake.Events(ctx, db.Pool, id)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	return evs[len(evs)-1].Code
}
