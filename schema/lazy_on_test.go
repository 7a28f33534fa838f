package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/schema"
)

// Before the step that turns lazy intake on there is no horizon, and a
// dispatcher run with --promote-ahead 3h moved the promoter's watermarks
// 3 h ahead. The step moves them back to its own time: a reminder it makes
// lazy (due 2.5 h ahead, past the 2 h horizon) lies above the final
// watermark, so the promoter will sweep it and the counts (nudgectl stats,
// the gauges) see it as pending. Fails without the step's reset: the
// reminder is below the final watermark, counted nowhere, never promoted.
func TestLazyIntakeOnMovesTheWatermarksBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// What two passes with H = 3 h leave (a sweep completed twice).
	db := migratedAround(t, testenv.LazyIntakeOn(t).Version, schema.MigrateAfterRollout, func(db *testenv.DB) {
		_, err := db.Pool.Exec(ctx, `UPDATE nudge_promoter SET final_until = now() + interval '3 hours',
			prov_until = now() + interval '3 hours', prov_wait = '{}', passed_at = now(), ahead = interval '3 hours'`)
		require.NoError(t, err)
	})

	due := time.Now().Add(150 * time.Minute)
	var status string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT status FROM nudge_try_schedule('acme', 'far', 'email',
		'learner@example.com', 't', '{}', $1, $2)`, due, due.Add(time.Hour)).Scan(&status))
	require.Equal(t, "created", status)
	var lazy, below bool
	var pending int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT r.lazy, r.due_at < p.final_until,
		(SELECT coalesce(sum(u.n), 0) FROM nudge_unpromoted_due('infinity') u)
		FROM reminders r, nudge_promoter p WHERE r.key = 'far'`).Scan(&lazy, &below, &pending))
	require.True(t, lazy, "due 2.5 h ahead: lazy")
	require.False(t, below, "above the final watermark: the promoter will sweep it")
	require.Equal(t, 1, pending, "counted as pending")
}
