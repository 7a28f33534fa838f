package schema_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
)

// droppedByVersion37 are the state columns 0037 drops from reminders.
var droppedByVersion37 = []string{
	"state", "fence", "lease_until", "attempts", "republishes", "next_attempt_at", "enqueued_at",
	"last_error", "reason", "updated_at", "finished_at", "purged_at", "dispatch_batch",
	"claimed_at", "claimed_fence", "claimed_by", "started_at", "started_fence", "started_by",
	"delivered_by", "requested_due_at",
}

// wideColumnRefs returns the references in a function body to one of
// reminders' dropped columns: through reminders itself or an alias of it
// (FROM/JOIN/UPDATE reminders [AS] x), or a SET of UPDATE reminders.
// PostgreSQL checks views, indexes, policies, constraints and triggers
// when a column is dropped; a function body it checks only when run.
func wideColumnRefs(body string) []string {
	body = strings.ToLower(body)
	aliases := map[string]bool{"reminders": true}
	for _, m := range regexp.MustCompile(`\breminders\s+(?:as\s+)?([a-z_][a-z0-9_]*)`).FindAllStringSubmatch(body, -1) {
		switch m[1] {
		case "where", "set", "on", "join", "using", "left", "inner", "cross", "order", "group", "limit",
			"returning", "for", "select", "values", "offset", "union", "when", "then", "and", "or", "default":
		default:
			aliases[m[1]] = true
		}
	}
	var out []string
	for _, c := range droppedByVersion37 {
		for a := range aliases {
			if regexp.MustCompile(`\b` + a + `\.` + c + `\b`).MatchString(body) {
				out = append(out, a+"."+c)
			}
		}
		set := regexp.MustCompile(`update\s+reminders\b[^;]*?\bset\b[^;]*?(?:^|[\s,])` + c + `\s*=`)
		if loc := set.FindStringIndex(body); loc != nil && !strings.Contains(body[loc[0]:loc[1]], "from") {
			out = append(out, "UPDATE reminders SET "+c)
		}
	}
	return out
}

func TestWideColumnRefs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		body string
		want []string
	}{
		{`SELECT s.state FROM reminders r JOIN reminder_state s ON s.id = r.id`, nil},
		{`SELECT r.state FROM reminders r`, []string{"r.state"}},
		{`SELECT x.fence FROM reminders AS x`, []string{"x.fence"}},
		{`UPDATE reminders SET attempts = 0 WHERE id = 1`, []string{"UPDATE reminders SET attempts"}},
		{`UPDATE reminders r SET recipient = 'a', reason = NULL`, []string{"UPDATE reminders SET reason"}},
		{`UPDATE reminders r SET data = '{}' WHERE r.id = 1; UPDATE reminder_state s SET state = 'x'`, nil},
		{`SELECT reminders.purged_at FROM reminders`, []string{"reminders.purged_at"}},
		{`SELECT r.due_at, r.tz, r.window_days FROM reminders r`, nil},
	} {
		require.Equal(t, c.want, wideColumnRefs(c.body), c.body)
	}
}

// After the after-rollout step (37), no function body of the schema names
// a column 37 dropped, and every LANGUAGE sql function still compiles
// (re-created with check_function_bodies on, in a transaction rolled
// back). The plpgsql ones are run by the tests of the functions.
func TestNoFunctionNamesADroppedColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	var cols int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = 'reminders'::regclass AND attnum > 0 AND NOT attisdropped AND attname = ANY($1)`,
		droppedByVersion37).Scan(&cols))
	require.Zero(t, cols, "37 dropped them")

	rows, err := db.Pool.Query(ctx, `SELECT p.oid::regprocedure::text, l.lanname, p.prosrc, pg_get_functiondef(p.oid)
		FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
		WHERE p.pronamespace = current_schema()::regnamespace AND p.prokind = 'f'`)
	require.NoError(t, err)
	type fn struct{ name, lang, src, def string }
	fns, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (fn, error) {
		var f fn
		return f, r.Scan(&f.name, &f.lang, &f.src, &f.def)
	})
	require.NoError(t, err)
	require.Greater(t, len(fns), 50)
	for _, f := range fns {
		require.Empty(t, wideColumnRefs(f.src), f.name)
		if f.lang != "sql" {
			continue
		}
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SET LOCAL check_function_bodies = on`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, f.def)
		require.NoError(t, err, fmt.Sprintf("%s no longer compiles", f.name))
		require.NoError(t, tx.Rollback(ctx))
	}
}
