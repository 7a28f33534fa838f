package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// The local-time functions of version 11, as each role calls them.
var localTimeCalls = []string{
	`SELECT nudge_valid_tz('Europe/Stockholm')`,
	`SELECT nudge_resolve_local('2027-03-28 02:30', 'Europe/Stockholm')`,
	`SELECT nudge_window_open('08:00', '21:00', 62, 'Europe/Stockholm', now())`,
	`SELECT nudge_next_opening('08:00', '21:00', 62, 'Europe/Stockholm', now())`,
}

// Every component role may call the local-time functions (the window
// functions call the resolver under the caller's rights, so each needs its
// grant); retention and a role outside the groups may not.
func TestLocalTimeFunctionsUnderTheRoles(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	for _, group := range groupRoles {
		pool, _ := b.login(t, group)
		for _, sql := range localTimeCalls {
			_, err := pool.Exec(ctx, sql)
			require.NoError(t, err, "%s: %s", group, sql)
		}
		var at time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT nudge_resolve_local('2027-10-31 02:30', 'Europe/Stockholm')`).Scan(&at))
		require.True(t, at.Equal(time.Date(2027, 10, 31, 0, 30, 0, 0, time.UTC)), "%s: the earlier reading, got %s", group, at)
	}
	for _, group := range []string{"nudge_retention", ""} {
		pool, login := b.login(t, group)
		// Usage of the schema, so that what is denied is EXECUTE itself.
		_, err := b.db.Pool.Exec(ctx, `GRANT USAGE ON SCHEMA `+pgx.Identifier{b.db.Schema}.Sanitize()+
			` TO `+pgx.Identifier{login}.Sanitize())
		require.NoError(t, err)
		for _, sql := range localTimeCalls {
			requireDenied(t, pool, sql)
		}
	}
}

// An invalid window is an error, not an answer.
func TestLocalTimeRejectsInvalidWindows(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	for _, sql := range []string{
		`SELECT nudge_window_open('08:00', '08:00', 0, 'UTC', now())`,
		`SELECT nudge_window_open('08:00', NULL, 0, 'UTC', now())`,
		`SELECT nudge_next_opening('08:00', '00:00', 0, 'UTC', now())`,
		`SELECT nudge_window_open('24:00', '08:00', 0, 'UTC', now())`,
		`SELECT nudge_window_open('08:00', '21:00', 128, 'UTC', now())`,
	} {
		_, err := b.db.Pool.Exec(context.Background(), sql)
		require.ErrorContains(t, err, "invalid send window", sql)
		require.ErrorContains(t, err, "22023", sql)
	}
	var open bool
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT nudge_window_open(NULL, NULL, NULL, 'UTC', now())`).Scan(&open))
	require.True(t, open, "a NULL opening time means any time")
}

// Why nudge_resolve_local exists: PostgreSQL's AT TIME ZONE takes the later
// reading of a repeated local time, the rule is the earlier one; both move a
// skipped one forward by the gap.
func TestLocalTimeOverlapIsNotAtTimeZones(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	var pgOverlap, ours, pgGap, oursGap time.Time
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
		SELECT timestamp '2027-10-31 02:30' AT TIME ZONE 'Europe/Stockholm',
		       nudge_resolve_local('2027-10-31 02:30', 'Europe/Stockholm'),
		       timestamp '2027-03-28 02:30' AT TIME ZONE 'Europe/Stockholm',
		       nudge_resolve_local('2027-03-28 02:30', 'Europe/Stockholm')`).Scan(&pgOverlap, &ours, &pgGap, &oursGap))
	require.True(t, pgOverlap.Equal(time.Date(2027, 10, 31, 1, 30, 0, 0, time.UTC)), "AT TIME ZONE: %s", pgOverlap)
	require.True(t, ours.Equal(time.Date(2027, 10, 31, 0, 30, 0, 0, time.UTC)), "nudge_resolve_local: %s", ours)
	require.True(t, pgGap.Equal(oursGap) && oursGap.Equal(time.Date(2027, 3, 28, 1, 30, 0, 0, time.UTC)), "gap: %s, %s", pgGap, oursGap)
}
