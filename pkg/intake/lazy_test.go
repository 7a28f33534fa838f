package intake_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Schema 38's lazy intake in ScheduleMany. Off (as the migration leaves
// it), every reminder gets its state row, as before, and lazy is false;
// on, a reminder due at least the horizon after intake's clock gets none
// (the promoter inserts it), one due sooner gets its row as before.
func TestScheduleManyLazyIntake(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	now := time.Now().UTC().Truncate(time.Second)
	schedule := func(prefix string, dues ...time.Duration) {
		t.Helper()
		var reqs []intake.Request
		for i, d := range dues {
			reqs = append(reqs, intake.Request{Tenant: "acme", Key: fmt.Sprintf("%s:%d", prefix, i), Channel: reminder.Email,
				Recipient: "learner@example.com", Template: "course-expiry", Data: map[string]any{"course": "Go 101"},
				DueAt: now.Add(d), Deadline: now.Add(d + time.Hour), TZ: "Europe/Paris"})
		}
		res, err := intake.ScheduleMany(ctx, db.Pool, reqs)
		require.NoError(t, err)
		for _, r := range res {
			require.Equal(t, intake.Created, r.Status)
		}
	}
	rows := func(prefix string) []string {
		t.Helper()
		rs, err := db.Pool.Query(ctx, `SELECT r.key || ' lazy=' || r.lazy || ' state=' || CASE WHEN s.id IS NULL THEN 'none' ELSE row(s.tenant, s.channel,
			s.state, s.fence, s.due_at = r.due_at, s.deadline = r.deadline, s.tz, s.window_open, s.window_close,
			s.window_days, s.requested_due_at, s.attempts, s.lease_until)::text END
			FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id WHERE r.key LIKE $1 || ':%' ORDER BY r.key`, prefix)
		require.NoError(t, err)
		var out []string
		for rs.Next() {
			var s string
			require.NoError(t, rs.Scan(&s))
			out = append(out, s)
		}
		require.NoError(t, rs.Err())
		return out
	}
	full := "lazy=false state=(acme,email,pending,0,t,t,Europe/Paris,,,,,0,)"

	// Off, as an operator turns it off again after schema 44 turned it on
	// (docs/deploy.md) and as schema 38 left it.
	_, err := db.Pool.Exec(ctx, `UPDATE nudge_lazy_intake SET horizon = NULL`)
	require.NoError(t, err)
	schedule("off", time.Hour, 72*time.Hour)
	require.Equal(t, []string{"off:0 " + full, "off:1 " + full}, rows("off"), "setting off: as before schema 38")

	_, err = db.Pool.Exec(ctx, `UPDATE nudge_lazy_intake SET horizon = interval '2 hours'`)
	require.NoError(t, err)
	schedule("on", time.Hour, 72*time.Hour, 2*time.Hour-time.Minute, 2*time.Hour+time.Minute)
	require.Equal(t, []string{"on:0 " + full, "on:1 lazy=true state=none", "on:2 " + full, "on:3 lazy=true state=none"},
		rows("on"))
}
