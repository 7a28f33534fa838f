package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
)

// EnvelopeLimit is the previous release's limit until the after-rollout
// migration 49 creates its table (no error: the table is looked for first),
// 200 after it, what an operator sets, and the previous release's again
// when the row is gone.
func TestEnvelopeLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	before := store.New(testenv.PostgresBeforeRollout(t).Pool)
	n, err := before.EnvelopeLimit(ctx)
	require.NoError(t, err)
	require.Equal(t, message.PreviousMaxBatchEntries, n, "no table before the after-rollout step")

	db := testenv.Postgres(t)
	s := store.New(db.Pool)
	n, err = s.EnvelopeLimit(ctx)
	require.NoError(t, err)
	require.Equal(t, message.MaxBatchEntries, n, "migration 49 sets this release's limit")

	_, err = db.Pool.Exec(ctx, `UPDATE nudge_envelope_limit SET max_entries = 100`)
	require.NoError(t, err)
	n, err = s.EnvelopeLimit(ctx)
	require.NoError(t, err)
	require.Equal(t, 100, n, "an operator's value (the way back to the previous release's workers)")

	_, err = db.Pool.Exec(ctx, `DELETE FROM nudge_envelope_limit`)
	require.NoError(t, err)
	n, err = s.EnvelopeLimit(ctx)
	require.NoError(t, err)
	require.Equal(t, message.PreviousMaxBatchEntries, n, "no row: the previous release's limit")

	_, err = db.Pool.Exec(ctx, `INSERT INTO nudge_envelope_limit (max_entries) VALUES (0)`)
	require.Error(t, err, "a limit below 1 is refused")
}
