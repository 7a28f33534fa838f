package schema_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/schema"
)

// Schema version 34: the SQL functions and the timeline view answer from
// reminder_state and write it, never reminders' copies of the state. Run
// with the mirror of version 32 off (as the next release, which drops it,
// runs them) and reminders' copies of the state made wrong: every answer,
// write and event must still be the one reminder_state calls for, and the
// copies must be left as they were.
func TestStateFunctionsUseReminderState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.PostgresBeforeRollout(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	exec(`ALTER TABLE reminders DISABLE TRIGGER reminders_state_mirror_inserted`)
	exec(`ALTER TABLE reminders DISABLE TRIGGER reminders_state_mirror_updated`)
	exec(`ALTER TABLE reminder_state DISABLE TRIGGER reminder_state_mirror_back`)

	// A campaign, for nudge_campaign_status: its reminders are the keys
	// campaign:<id>:...
	exec(`INSERT INTO campaign_sources (name, tenant, relation, key_column, recipient_column, data_column,
	                                    date_column, zone_column, staged)
	      VALUES ('src', 'acme', 'campaign_staged_rows'::regclass, 'key', 'recipient', 'data', 'date', 'zone', true)`)
	var campaign int64
	require.NoError(t, db.Pool.QueryRow(ctx, `
		INSERT INTO campaigns (tenant, name, channel, template, source, due_at, deadline, lease)
		VALUES ('acme', 'spring', 'email', 'course-expiry', 'src', '2030-01-01 09:00Z', '2030-01-02 09:00Z', '1 minute')
		RETURNING id`).Scan(&campaign))
	c1, c2 := fmt.Sprintf("campaign:%d:1", campaign), fmt.Sprintf("campaign:%d:2", campaign)

	due, deadline := time.Date(2030, 1, 1, 9, 0, 0, 0, time.UTC), time.Date(2030, 1, 2, 9, 0, 0, 0, time.UTC)
	due2, deadline2 := due.Add(time.Hour), deadline.Add(time.Hour)
	ids := map[string]int64{}
	keys := []string{"exists", "resched-to", "window", "update", "cancel", "resched", "p-1", "p-2", "p-3", c1, c2}
	for _, key := range keys {
		var id int64
		require.NoError(t, db.Pool.QueryRow(ctx, `
			SELECT nudge_schedule('acme', $1, 'email', 'a@example.com', 'course-expiry', '{}', $2, $3,
			                      p_tz => 'Europe/Stockholm', p_window_open => '08:00', p_window_close => '20:00',
			                      p_window_days => 31)`, key, due, deadline).Scan(&id))
		ids[key] = id
	}

	// Intake wrote the state row itself: no trigger did.
	type stateRow struct {
		State, Tz, Open, Close string
		Fence                  int64
		Days                   int32
		Due, Deadline          time.Time
	}
	stateOf := func(key string) stateRow {
		t.Helper()
		var s stateRow
		require.NoError(t, db.Pool.QueryRow(ctx, `
			SELECT state, fence, due_at, deadline, coalesce(tz, ''), coalesce(window_open::text, ''),
			       coalesce(window_close::text, ''), coalesce(window_days, -1)
			  FROM reminder_state WHERE id = $1`, ids[key]).
			Scan(&s.State, &s.Fence, &s.Due, &s.Deadline, &s.Tz, &s.Open, &s.Close, &s.Days), key)
		s.Due, s.Deadline = s.Due.UTC(), s.Deadline.UTC()
		return s
	}
	scheduled := stateRow{State: "pending", Fence: 0, Due: due, Deadline: deadline, Tz: "Europe/Stockholm",
		Open: "08:00:00", Close: "20:00:00", Days: 31}
	for _, key := range keys {
		require.Equal(t, scheduled, stateOf(key), key)
	}

	// reminders' copies, wrong from here on: a function that read them
	// would answer terminal, conflict, or a window of none.
	exec(`UPDATE reminders SET state = 'failed', fence = 77, due_at = due_at - interval '1 day', tz = 'Asia/Tokyo',
	                           window_open = NULL, window_close = NULL, window_days = NULL`)
	exec(`UPDATE reminder_state SET state = 'sending', lease_until = $2 WHERE id = $1`, ids["p-3"], due)
	exec(`UPDATE reminder_state SET state = 'delivered', finished_at = $2 WHERE id = $1`, ids[c2], due)
	exec(`UPDATE reminder_state SET claimed_at = $2, claimed_fence = 1, claimed_by = 'd', fence = 1 WHERE id = $1`,
		ids["exists"], due)

	var status string
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT status FROM nudge_try_schedule('acme', 'exists', 'email', 'a@example.com', 'course-expiry', '{}', $1, $2,
		                                      p_tz => 'Europe/Stockholm', p_window_open => '08:00',
		                                      p_window_close => '20:00', p_window_days => 31)`, due, deadline).Scan(&status))
	require.Equal(t, "exists", status, "the same content again, as reminder_state holds it")
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT status FROM nudge_try_schedule('acme', 'exists', 'email', 'a@example.com', 'course-expiry', '{}', $1, $2,
		                                      p_tz => 'Asia/Tokyo')`, due, deadline).Scan(&status))
	require.Equal(t, "conflict", status, "another zone than reminder_state's")

	type change struct {
		ID          *int64
		Key, Status string
		State       *string
	}
	changeOf := func(sql string, args ...any) []change {
		t.Helper()
		rows, err := db.Pool.Query(ctx, sql, args...)
		require.NoError(t, err, sql)
		out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[change])
		require.NoError(t, err, sql)
		return out
	}
	ptr := func(s string) *string { return &s }
	id := func(key string) *int64 { x := ids[key]; return &x }
	require.Equal(t, []change{{id("resched-to"), "resched-to", "changed", ptr("pending")}},
		changeOf(`SELECT * FROM nudge_reschedule_to('acme', 'resched-to', $1, $2)`, due2, deadline2))
	require.Equal(t, []change{{id("resched-to"), "resched-to", "unchanged", ptr("pending")}},
		changeOf(`SELECT * FROM nudge_reschedule_to('acme', 'resched-to', $1, $2)`, due2, deadline2))
	require.Equal(t, []change{{id("window"), "window", "changed", ptr("pending")}},
		changeOf(`SELECT * FROM nudge_reschedule_window('acme', 'window', $1, $2, '09:00', '17:00', 31)`, due2, deadline2))
	require.Equal(t, []change{{id("update"), "update", "changed", ptr("pending")}},
		changeOf(`SELECT * FROM nudge_update('acme', 'update', 'b@example.com', NULL, NULL)`))
	require.Equal(t, []change{{id("p-3"), "p-3", "sending", ptr("sending")}},
		changeOf(`SELECT * FROM nudge_update('acme', 'p-3', 'b@example.com', NULL, NULL)`))
	require.Equal(t, []change{{nil, "none", "not_found", nil}},
		changeOf(`SELECT * FROM nudge_update('acme', 'none', 'b@example.com', NULL, NULL)`))
	var state string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT nudge_cancel('acme', 'cancel')`).Scan(&state))
	require.Equal(t, "canceled", state)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT nudge_cancel('acme', $1)`, c2).Scan(&state))
	require.Equal(t, "delivered", state)
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT nudge_reschedule('acme', 'resched', $1, $2)`, due2, deadline2).
		Scan(&state))
	require.Equal(t, "pending", state)
	require.Equal(t, []change{
		{id("p-1"), "p-1", "changed", ptr("canceled")},
		{id("p-2"), "p-2", "changed", ptr("canceled")},
		{id("p-3"), "p-3", "sending", ptr("sending")},
	}, changeOf(`SELECT * FROM nudge_cancel_prefix('acme', 'p-', 100)`))

	// What each wrote: reminder_state, under a new fence where it moved.
	moved := func(s stateRow, state string, fence int64, due, deadline time.Time, open, close string) stateRow {
		s.State, s.Fence, s.Due, s.Deadline, s.Open, s.Close = state, fence, due, deadline, open, close
		return s
	}
	for key, want := range map[string]stateRow{
		"resched-to": moved(scheduled, "pending", 1, due2, deadline2, "08:00:00", "20:00:00"),
		"window":     moved(scheduled, "pending", 1, due2, deadline2, "09:00:00", "17:00:00"),
		"update":     moved(scheduled, "pending", 1, due, deadline, "08:00:00", "20:00:00"),
		"cancel":     moved(scheduled, "canceled", 1, due, deadline, "08:00:00", "20:00:00"),
		"resched":    moved(scheduled, "pending", 1, due2, deadline2, "08:00:00", "20:00:00"),
		"p-1":        moved(scheduled, "canceled", 1, due, deadline, "08:00:00", "20:00:00"),
		"p-3":        moved(scheduled, "sending", 0, due, deadline, "08:00:00", "20:00:00"),
		"exists":     moved(scheduled, "pending", 1, due, deadline, "08:00:00", "20:00:00"),
	} {
		require.Equal(t, want, stateOf(key), key)
	}
	// The events: from reminder_state's state, with its new fence.
	rows, err := db.Pool.Query(ctx, `SELECT r.key, e.from_state, e.to_state, e.fence, e.code
	                                   FROM reminder_events e JOIN reminders r ON r.id = e.reminder_id
	                                  WHERE e.code <> 'scheduled' ORDER BY e.id`)
	require.NoError(t, err)
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var key, from, to, code string
		var fence int64
		err := r.Scan(&key, &from, &to, &fence, &code)
		return fmt.Sprintf("%s %s→%s %d %s", key, from, to, fence, code), err
	})
	require.NoError(t, err)
	require.Equal(t, []string{
		"resched-to pending→pending 1 rescheduled",
		"window pending→pending 1 rescheduled",
		"update pending→pending 1 updated",
		"cancel pending→canceled 1 canceled",
		"resched pending→pending 1 rescheduled",
		"p-1 pending→canceled 1 canceled",
		"p-2 pending→canceled 1 canceled",
	}, events)

	// The content went to the wide row; none of its copies of the state moved.
	var recipient string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT recipient FROM reminders WHERE id = $1`, ids["update"]).
		Scan(&recipient))
	require.Equal(t, "b@example.com", recipient)
	var copiesMoved int
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT count(*) FROM reminders
		 WHERE (state, fence, tz, window_close) IS DISTINCT FROM ('failed', 77, 'Asia/Tokyo', NULL)`).Scan(&copiesMoved))
	require.Zero(t, copiesMoved, "a function wrote reminders' copies of the state")

	// The campaign's reminders by their state on reminder_state.
	var deliveries string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT deliveries::text FROM nudge_campaign_status('acme', $1)`, campaign).
		Scan(&deliveries))
	require.JSONEq(t, `{"pending": 1, "delivered": 1}`, deliveries)

	// The timeline folds the slots reminder_state holds.
	var folded string
	require.NoError(t, db.Pool.QueryRow(ctx, `
		SELECT string_agg(concat_ws(' ', seq, code, fence, actor, CASE WHEN id IS NULL THEN 'folded' ELSE 'stored' END), ', ' ORDER BY seq)
		  FROM reminder_timeline WHERE reminder_id = $1`, ids["exists"]).Scan(&folded))
	require.Equal(t, "1 scheduled 0 intake stored, 2 claimed 1 d folded", folded)
}

// Schema version 34 replaces functions and the timeline view in place:
// every function keeps its signature, result, volatility, security, settings
// and grants, and the view its columns, options and grants, as version 33
// left them.
func TestStateFunctionsKeepTheirContract(t *testing.T) {
	t.Parallel()
	before, after := contractAround(t, 34, schema.Migrate)
	require.Equal(t, before, after)
}

// Schema version 39 replaces functions in place the same way (and adds
// nudge_materialize and nudge_unpromoted_due): every other function keeps
// its contract as the versions before left it.
func TestUnpromotedFunctionsKeepTheirContract(t *testing.T) {
	t.Parallel()
	before, after := contractAround(t, 39, schema.MigrateAfterRollout)
	// Schema 43 creates nudge_unpromoted_due too (CREATE OR REPLACE), so it
	// is in both lists; left out of both.
	others := func(cs []string) []string {
		var kept []string
		for _, c := range cs {
			if !strings.HasPrefix(c, "nudge_materialize(") && !strings.HasPrefix(c, "nudge_unpromoted_due(") {
				kept = append(kept, c)
			}
		}
		return kept
	}
	require.Equal(t, others(before), others(after))
}

// Schema version 43 replaces nudge_unpromoted_due(timestamptz) in place,
// keeping its signature, columns and grants (release N-1's scrape and
// nudgectl stats call it), and adds nudge_unpromoted_due(timestamptz,
// integer) beside it; every other function keeps its contract.
func TestBoundedUnpromotedKeepsTheContract(t *testing.T) {
	t.Parallel()
	before, after := contractAround(t, 43, schema.MigrateAfterRollout)
	const capped = "nudge_unpromoted_due(timestamp with time zone,integer) |"
	var kept []string
	for _, c := range after {
		if !strings.HasPrefix(c, capped) {
			kept = append(kept, c)
		}
	}
	require.Equal(t, before, kept)
	require.Len(t, after, len(before)+1, "one function added: %s", capped)
}

// contractAround migrates a new schema with every migration but version
// (recorded as applied, migrate skips it), then with it alone, and returns
// functionContract before and after it.
func contractAround(t *testing.T, version int, migrate func(context.Context, pg.Beginner) ([]int, error)) (before, after []string) {
	t.Helper()
	db := migratedAround(t, version, migrate, func(db *testenv.DB) { before = functionContract(t, db) })
	return before, functionContract(t, db)
}

// migratedAround migrates a new schema with every migration but version
// (recorded as applied, migrate skips it), calls between, then applies
// version alone (requiring that migrate applies it and nothing else).
func migratedAround(t *testing.T, version int, migrate func(context.Context, pg.Beginner) ([]int, error),
	between func(db *testenv.DB)) *testenv.DB {
	t.Helper()
	ctx := context.Background()
	db := testenv.EmptyPostgres(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Pool.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	exec(`CREATE TABLE nudge_migrations (version integer PRIMARY KEY, name text NOT NULL,
	                                     applied_at timestamptz NOT NULL DEFAULT now())`)
	exec(`INSERT INTO nudge_migrations (version, name) VALUES ($1, 'skipped')`, version)
	_, err := migrate(ctx, db.Pool)
	require.NoError(t, err)
	between(db)
	exec(`DELETE FROM nudge_migrations WHERE version = $1`, version)
	applied, err := migrate(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []int{version}, applied)
	return db
}

// functionContract describes every function of db's schema (signature,
// result, volatility, security, settings, grants) and every view (grants,
// options, columns).
func functionContract(t *testing.T, db *testenv.DB) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
			SELECT concat_ws(' | ', p.oid::regprocedure::text, pg_get_function_arguments(p.oid),
			                 pg_get_function_result(p.oid), p.provolatile, p.prosecdef, p.proconfig::text,
			                 p.proacl::text)
			  FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace
			UNION ALL
			SELECT concat_ws(' | ', c.oid::regclass::text, c.relacl::text, c.reloptions::text,
			                 (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', '
			                                    ORDER BY a.attnum)
			                    FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0))
			  FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'v'
			ORDER BY 1`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}
