package schema_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Schema version 27 finds the enqueued and sending rows of a key prefix over
// the indexes of the work in flight, and the others over
// reminders_waiting_keys: a cancel by prefix still sees an open reminder in
// every state, answers the oldest first across the three, and counts what it
// would cancel as before.
func TestCancelPrefixFindsOpenRowsInEveryState(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	deadline := b.now.Add(time.Hour)
	// In id order: the state each is put in, with its lease (as the writer
	// that moves a row there leaves it: nil for none).
	lease := b.now.Add(time.Minute)
	rows := []struct {
		state reminder.State
		lease *time.Time
	}{
		{reminder.Sending, &lease},
		{reminder.Enqueued, nil}, // its batch confirmed: the dispatch lease cleared
		{reminder.Pending, nil},
		{reminder.Delivered, nil},
		{reminder.Enqueued, &lease}, // just claimed
		{reminder.Retrying, nil},
		{reminder.Leased, &lease},
		{reminder.Quarantined, nil},
		{reminder.Canceled, nil},
	}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = b.schedule(t, "acme", fmt.Sprintf("learner-42:%d", i), deadline)
		_, err := b.db.Pool.Exec(ctx, `UPDATE reminder_state SET state = $2, lease_until = $3 WHERE id = $1`, ids[i], r.state, r.lease)
		require.NoError(t, err)
	}
	// Another tenant's row and another prefix, in flight: never touched.
	theirs := b.schedule(t, "globex", "learner-42:0", deadline)
	other := b.schedule(t, "acme", "learner-43:0", deadline)
	for _, id := range []int64{theirs, other} {
		_, err := b.db.Pool.Exec(ctx, `UPDATE reminder_state SET state = 'enqueued' WHERE id = $1`, id)
		require.NoError(t, err)
	}

	n, err := intake.CountPrefix(ctx, b.db.Pool, "acme", "learner-42:")
	require.NoError(t, err)
	require.Equal(t, intake.PrefixCount{Open: 6, Sending: 1}, n)

	// The three oldest open ones, whatever index found them.
	cs, err := intake.CancelPrefix(ctx, b.db.Pool, "acme", "learner-42:", 3, "test", "")
	require.NoError(t, err)
	require.Equal(t, []intake.Change{
		{ID: ids[0], Key: "learner-42:0", Status: intake.AlreadySending, State: reminder.Sending},
		{ID: ids[1], Key: "learner-42:1", Status: intake.Changed, State: reminder.Canceled},
		{ID: ids[2], Key: "learner-42:2", Status: intake.Changed, State: reminder.Canceled},
	}, cs)
	cs, err = intake.CancelPrefix(ctx, b.db.Pool, "acme", "learner-42:", 100, "test", "")
	require.NoError(t, err)
	var got []int64
	for _, c := range cs {
		got = append(got, c.ID)
		if c.ID != ids[0] {
			require.Equal(t, intake.Changed, c.Status, "reminder %d", c.ID)
		}
	}
	require.Equal(t, []int64{ids[0], ids[4], ids[5], ids[6], ids[7]}, got)
	for i, want := range []reminder.State{reminder.Sending, reminder.Canceled, reminder.Canceled, reminder.Delivered,
		reminder.Canceled, reminder.Canceled, reminder.Canceled, reminder.Canceled, reminder.Canceled} {
		require.Equal(t, want, b.state(t, ids[i]), "row %d, %s before", i, rows[i].state)
	}
	require.Equal(t, reminder.Enqueued, b.state(t, theirs))
	require.Equal(t, reminder.Enqueued, b.state(t, other))
	n, err = intake.CountPrefix(ctx, b.db.Pool, "acme", "learner-42:")
	require.NoError(t, err)
	require.Equal(t, intake.PrefixCount{Open: 0, Sending: 1}, n)
}
