package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
)

// Schema 38 adds reminders.lazy as a catalogue change (a missing value, no
// rewrite: the ACCESS EXCLUSIVE lock is held for a moment on any size), and
// intake's function takes the lazy decision: with the setting off it writes
// the state row as before; on, it leaves it out for a reminder due at
// least the horizon ahead, and a duplicate of such a reminder compares
// against the wide row's recorded intent.
func TestLazyIntakeInTheScheduleFunction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	var missing bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT atthasmissing FROM pg_attribute
		WHERE attrelid = 'reminders'::regclass AND attname = 'lazy'`).Scan(&missing))
	require.True(t, missing, "ADD COLUMN stored a missing value: no row rewritten")

	far := time.Now().Add(72 * time.Hour).UTC().Truncate(time.Second)
	schedule := func(key string, due time.Time, template string) (status string) {
		t.Helper()
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT status FROM nudge_try_schedule('acme', $1, 'email',
			'learner@example.com', $2, '{"course": "Go 101"}', $3, $4)`, key, template, due, due.Add(time.Hour)).Scan(&status))
		return status
	}
	lazyState := func(key string) (lazy, state bool) {
		t.Helper()
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT r.lazy, EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)
			FROM reminders r WHERE r.key = $1`, key).Scan(&lazy, &state))
		return lazy, state
	}
	// Off (as 38 leaves it, and as an operator turns it off again after 44).
	_, err := db.Pool.Exec(ctx, `UPDATE nudge_lazy_intake SET horizon = NULL`)
	require.NoError(t, err)
	require.Equal(t, "created", schedule("off", far, "t"))
	lazy, state := lazyState("off")
	require.False(t, lazy)
	require.True(t, state, "setting off: the state row at intake")

	_, err = db.Pool.Exec(ctx, `UPDATE nudge_lazy_intake SET horizon = interval '2 hours'`)
	require.NoError(t, err)
	require.Equal(t, "created", schedule("soon", time.Now().Add(time.Hour), "t"))
	lazy, state = lazyState("soon")
	require.False(t, lazy)
	require.True(t, state, "due within the horizon: the state row at intake")
	require.Equal(t, "created", schedule("far", far, "t"))
	lazy, state = lazyState("far")
	require.True(t, lazy)
	require.False(t, state, "due past the horizon: no state row")

	require.Equal(t, "exists", schedule("far", far, "t"), "the same intent, read from the wide row")
	require.Equal(t, "conflict", schedule("far", far, "other"))
	require.Equal(t, "conflict", schedule("far", far.Add(time.Minute), "t"))
	require.Equal(t, "exists", schedule("off", far, "t"), "with a state row, as before")
}
