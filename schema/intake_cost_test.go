package schema_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
)

// Regression (issue 18): nudge_invalid was not inlined, because a STABLE
// text || integer in nudge_invalid_email_sms kept the IMMUTABLE function
// out of the planner's inlining, so every nudge_schedule call and every row
// of the bulk intake ran it through the SQL function executor. The plan of
// a call must show the check itself, no call of a validation function.
func TestIntakeValidationIsInlined(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `PREPARE inv(text, text, text, text, text, jsonb, timestamptz, timestamptz) AS
		SELECT nudge_invalid($1, $2, $3, $4, $5, $6, $7, $8)`)
	require.NoError(t, err)
	var plan strings.Builder
	rows, err := conn.Query(ctx, `EXPLAIN VERBOSE EXECUTE inv('t', 'k', 'sms', '+14155550100', 'x', '{}', now(), now())`)
	require.NoError(t, err)
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	require.Contains(t, plan.String(), "must be an E.164 phone number", "the check's body is in the plan")
	require.NotContains(t, plan.String(), "nudge_invalid", "a validation function is called, not inlined")

	// The oversized-data message, whose cast made the difference, is unchanged.
	var got []string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT nudge_invalid('t', 'k', 'sms', '+14155550100', 'x',
		jsonb_build_object('s', repeat('x', 70000)), now(), now() + interval '1 hour')`).Scan(&got))
	require.Equal(t, []string{"data", "must be at most 65536 bytes as JSON, got 70009"}, got)
}

// The zone CHECK holds nudge_tz_name_allowed's test inline since version
// 28: both must agree on every zone and abbreviation PostgreSQL knows and
// on the edge cases of the pattern.
func TestZoneCheckMatchesTheZoneNameRule(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	var check string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_get_expr(conbin, conrelid) FROM pg_constraint
		WHERE conrelid = 'reminders'::regclass AND conname = 'reminders_tz_name'`).Scan(&check))
	require.NotContains(t, check, "nudge_tz_name_allowed")
	var names, differ int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*),
		       count(*) FILTER (WHERE nudge_tz_name_allowed(tz) IS DISTINCT FROM (`+check+`))
		  FROM (SELECT name FROM pg_timezone_names UNION ALL SELECT abbrev FROM pg_timezone_abbrevs
		        UNION ALL VALUES (''), (' UTC'), ('UTC '), (E'posix/\nx'), (E'CET\n'), (E'x\nCET'), ('right/'),
		                         ('posixrules'), ('Localx'), ('posixx/a'), ('Europe/Stockholm')) AS z(tz)`).
		Scan(&names, &differ))
	require.Greater(t, names, 400)
	require.Zero(t, differ, "the CHECK and nudge_tz_name_allowed disagree")
}
