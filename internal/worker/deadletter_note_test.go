package worker_test

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// A message the worker dead-letters names a reminder: its timeline says so,
// with the reason, in nudgectl show (issue 17). Before, only a quarantine
// left a trace there; a wrong-channel message vanished into the dead-letter
// queue without one.
func TestDeadLetteringIsNotedInTheRemindersTimeline(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	ctx := context.Background()
	now := b.clock.Now()
	res, err := intake.Schedule(ctx, b.db.Pool, intake.Request{Tenant: "acme", Key: "mail", Channel: reminder.Email,
		Recipient: "a@example.com", Template: "course-expiry", DueAt: now.Add(-time.Second), Deadline: now.Add(time.Hour)})
	require.NoError(t, err)
	// Signed for the sms queue, naming an email reminder.
	body, hdr, err := b.keys.Seal(message.Envelope{ReminderID: res.ID, Channel: "sms", Deadline: now.Add(time.Hour), FirstSeen: now})
	require.NoError(t, err)
	b.publishRaw(t, "misrouted", body, hdr)
	// Unverifiable, naming the same reminder: not noted (its claims are not to be believed).
	b.publishRaw(t, "unsigned", body, nil)
	dead := b.drainDead(t, 2)
	require.Len(t, dead, 2)

	want := "reminder " + strconv.FormatInt(res.ID, 10) + ` is of channel "email", not sms`
	var evs []reminder.Event
	require.Eventually(t, func() bool { // noted after the dead letter is confirmed
		evs, err = intake.Events(ctx, b.db.Pool, res.ID)
		require.NoError(t, err)
		return len(evs) == 2
	}, 10*time.Second, 10*time.Millisecond)
	e := evs[1]
	require.Equal(t, reminder.CodeDeadLettered, e.Code)
	require.Equal(t, [2]reminder.State{reminder.Pending, reminder.Pending}, [2]reminder.State{e.From, e.To}, "a note, not a transition")
	require.Equal(t, want, e.Reason)
	r, err := intake.Get(ctx, b.db.Pool, res.ID)
	require.NoError(t, err)
	require.Equal(t, reminder.Pending, r.State, "the email reminder is left alone")

	cmd := ctl.Command()
	config.BindEnv(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"show", strconv.FormatInt(res.ID, 10), "--database-url", b.db.URL})
	require.NoError(t, cmd.Execute(), out.String())
	require.Regexp(t, `(?m)^\S+\s+pending\s+\(no change\)\s+0\s+w-\S+\s+dead-lettered: `+
		`reminder \d+ is of channel "email", not sms$`, out.String())
	require.Equal(t, 1, bytes.Count(out.Bytes(), []byte("dead-lettered")), out.String())
}
