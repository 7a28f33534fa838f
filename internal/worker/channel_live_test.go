package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Issue 13, finding 3, on real PostgreSQL and RabbitMQ: a signed message of
// channel sms naming an email reminder, consumed by the SMS worker, is
// dead-lettered with its reason; nothing is sent and the row is untouched.
func TestSMSWorkerDoesNotDeliverAnEmailReminder(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Config{})
	ctx := context.Background()
	now := b.clock.Now()
	res, err := intake.Schedule(ctx, b.db.Pool, intake.Request{
		Tenant: "acme", Key: "email-one", Channel: reminder.Email, Recipient: "learner@example.com",
		Template: "course-expiry", DueAt: now.Add(-time.Second), Deadline: now.Add(time.Hour),
	})
	require.NoError(t, err)
	b.dispatch(t) // enqueued, at a fence a claim would accept
	before, err := intake.Get(ctx, b.db.Pool, res.ID)
	require.NoError(t, err)
	require.Equal(t, reminder.Enqueued, before.State)

	body, hdr, err := b.keys.Seal(message.Envelope{ReminderID: res.ID, Fence: before.Fence, Channel: "sms",
		FirstSeen: now, Deadline: before.Deadline})
	require.NoError(t, err)
	b.publishRaw(t, "sms-names-email", body, hdr)

	dead := b.drainDead(t, 1)
	require.Equal(t, "sms-names-email", dead[0].MessageId)
	require.Contains(t, dead[0].Headers[message.HeaderReason], `is of channel "email", not sms`)
	require.Empty(t, b.sms.Attempts(), "an email reminder was sent by SMS")
	after, err := intake.Get(ctx, b.db.Pool, res.ID)
	require.NoError(t, err)
	require.Equal(t, before, after, "the row was touched")
}
