package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// TestClaimForDeliveryOnlyOfItsChannel: a worker claims only reminders of
// its own channel, whatever a message names (issue 13, finding 3: an SMS
// worker "delivered" an email reminder to an email address by SMS).
func TestClaimForDeliveryOnlyOfItsChannel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	id := b.schedule(t, "email-one", now.Add(-time.Minute), now.Add(time.Hour)) // an email reminder
	fence := b.enqueue(t, id)
	before := b.get(t, id)

	rows, claimed, err := b.st.ClaimForDelivery(ctx, now, reminder.SMS, "", []store.Fenced{{ID: id, Fence: fence}}, time.Minute, "sms-worker")
	require.NoError(t, err)
	require.Empty(t, claimed, "the sms worker claimed an email reminder")
	require.Equal(t, reminder.Email, rows[id].Channel, "the row is returned, so the worker can tell why")
	require.Equal(t, before, b.get(t, id), "the row is untouched")

	_, _, err = b.st.ClaimForDelivery(ctx, now, "", "", []store.Fenced{{ID: id, Fence: fence}}, time.Minute, "w")
	require.ErrorContains(t, err, "must be email, sms or webhook", "a claim must name its channel")

	_, claimed, err = b.st.ClaimForDelivery(ctx, now, reminder.Email, "", []store.Fenced{{ID: id, Fence: fence}}, time.Minute, "email-worker")
	require.NoError(t, err)
	require.Contains(t, claimed, id, "its own channel's worker claims it")
}

// A worker's store settles only its own channel's reminders: an SMS worker
// holding a message (signed with the SMS key) that names an email reminder
// cannot quarantine or expire it, whatever the message's delivery count.
func TestSettleQueuedOnlyOfItsChannel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	id := b.schedule(t, "email-one", now.Add(-time.Minute), now.Add(time.Hour)) // an email reminder
	fence := b.enqueue(t, id)
	before := b.get(t, id)
	f := []store.Fenced{{ID: id, Fence: fence}}

	sms := b.st.ForChannel(reminder.SMS)
	moved, err := sms.Quarantine(ctx, now, f, "sms-worker", "poison")
	require.NoError(t, err)
	require.Empty(t, moved, "an sms worker quarantined an email reminder")
	moved, err = sms.ExpireEarly(ctx, now, f, "sms-worker", "no capacity")
	require.NoError(t, err)
	require.Empty(t, moved, "an sms worker expired an email reminder")
	require.Equal(t, before, b.get(t, id), "the row is untouched")

	moved, err = b.st.ForChannel(reminder.Email).Quarantine(ctx, now, f, "email-worker", "poison")
	require.NoError(t, err)
	require.True(t, moved[id], "its own channel's worker settles it")
}
