package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/schema"
)

// planMigration is a migration of version v for Plan's table tests.
func planMigration(v int, after bool) schema.Migration {
	return schema.Migration{Version: v, Name: "m", AfterRollout: after}
}

// planVersions are the versions of ms, in order (empty, not nil, for none).
func planVersions(ms []schema.Migration) []int {
	out := []int{}
	for _, m := range ms {
		out = append(out, m.Version)
	}
	return out
}

// versionSet is the applied set of Plan's argument.
func versionSet(vs ...int) map[int]bool {
	out := map[int]bool{}
	for _, v := range vs {
		out[v] = true
	}
	return out
}

// Plan decides what a run applies: without the after-rollout step it stops
// at the first after-rollout migration not yet applied and applies nothing
// past it; with the step, everything not yet applied, in order.
func TestPlanStopsBeforeTheAfterRolloutStep(t *testing.T) {
	t.Parallel()
	m, versions, set := planMigration, planVersions, versionSet
	migs := []schema.Migration{m(33, false), m(34, false), m(35, true), m(36, false), m(37, true), m(38, false)}
	cases := []struct {
		name         string
		applied      map[int]bool
		afterRollout bool
		run, waiting []int
	}{
		{"fresh: up to the first after-rollout step", set(), false, []int{33, 34}, []int{35, 36, 37, 38}},
		{"fresh, after the rollout: all", set(), true, []int{33, 34, 35, 36, 37, 38}, []int{}},
		{"upgrading from 33", set(33), false, []int{34}, []int{35, 36, 37, 38}},
		{"the step pending: nothing to run", set(33, 34), false, []int{}, []int{35, 36, 37, 38}},
		{"the step pending, run after the rollout", set(33, 34), true, []int{35, 36, 37, 38}, []int{}},
		{"the step done: up to the next step", set(33, 34, 35), false, []int{36}, []int{37, 38}},
		{"the next step done too", set(33, 34, 35, 36, 37), false, []int{38}, []int{}},
		{"everything applied", set(33, 34, 35, 36, 37, 38), false, []int{}, []int{}},
		{"everything applied, after the rollout", set(33, 34, 35, 36, 37, 38), true, []int{}, []int{}},
		// A later migration applied by an earlier run of this kind (it
		// cannot happen through Plan, but a hole is not filled past the
		// step either).
		{"a hole behind the step", set(33, 35, 36), false, []int{34}, []int{37, 38}},
	}
	for _, c := range cases {
		run, waiting := schema.Plan(migs, c.applied, c.afterRollout)
		require.Equal(t, c.run, versions(run), c.name)
		require.Equal(t, c.waiting, versions(waiting), c.name)
	}
}

// This release's shape: release 1 of the narrow-state layout left 35
// waiting for its rollout; this one adds a regular 36 and its own
// after-rollout 37 (dropping reminders' stale state columns). A regular
// migration behind a pending after-rollout one waits with it.
func TestPlanWithTwoAfterRolloutSteps(t *testing.T) {
	t.Parallel()
	m, versions, set := planMigration, planVersions, versionSet
	migs := []schema.Migration{m(33, false), m(34, false), m(35, true), m(36, false), m(37, true)}
	for _, c := range []struct {
		name         string
		applied      map[int]bool
		afterRollout bool
		run, waiting []int
	}{
		{"v34 (release 1 rolling) to this release: both steps and 36 wait", set(33, 34), false, []int{}, []int{35, 36, 37}},
		{"v34 to this release, after the rollout: all", set(33, 34), true, []int{35, 36, 37}, []int{}},
		{"35 applied (release 1 rolled out): 36 runs, 37 waits", set(33, 34, 35), false, []int{36}, []int{37}},
		{"35 applied, after the rollout", set(33, 34, 35), true, []int{36, 37}, []int{}},
		{"36 applied too: 37 waits", set(33, 34, 35, 36), false, []int{}, []int{37}},
		{"36 applied too, after the rollout: 37", set(33, 34, 35, 36), true, []int{37}, []int{}},
		{"37 applied: nothing", set(33, 34, 35, 36, 37), false, []int{}, []int{}},
	} {
		run, waiting := schema.Plan(migs, c.applied, c.afterRollout)
		require.Equal(t, c.run, versions(run), c.name)
		require.Equal(t, c.waiting, versions(waiting), c.name)
	}
}

// The embedded migrations: 0035 drops the state mirror after release 1's
// rollout, 0037 reminders' stale state columns after release 2's, 0041 the
// claim's old index (reminder_state_pending_tenant) after release 3's;
// after this release's, lazy intake on (with reminder_state's foreign key
// dropped; found by its name, as its number may change at a merge) and
// 0045 the expiry's old index (reminder_state_unsent_deadline), whose
// readers this release rewrote; 0048 the index of every terminal row
// (reminder_state_terminal), whose readers read the unpurged and the
// purged rows' indexes (0047) instead; 0049 the dispatcher's envelope limit
// of 200 (nudge_envelope_limit), which the previous release's workers, at
// 100, would refuse.
func TestAfterRolloutMigrations(t *testing.T) {
	t.Parallel()
	migs, err := schema.Migrations()
	require.NoError(t, err)
	var after []string
	for _, m := range migs {
		if m.AfterRollout {
			after = append(after, m.String())
		}
	}
	require.Equal(t, []string{"0035_drop_state_mirror.after-rollout", "0037_drop_wide_state_columns.after-rollout",
		"0041_drop_pending_tenant.after-rollout", testenv.LazyIntakeOn(t).String(),
		"0045_drop_unsent_deadline.after-rollout", "0048_drop_terminal_index.after-rollout",
		"0049_envelope_limit.after-rollout"}, after)
}

// Migrate leaves the mirror's drop waiting, and reports it; the after-rollout
// step drops the mirror's triggers and functions and every index of
// reminders that names state, and a state change then stays in
// reminder_state.
func TestMigrateAfterRolloutDropsTheMirror(t *testing.T) {
	t.Parallel()
	db := testenv.EmptyPostgres(t)
	ctx := context.Background()
	applied, err := schema.Migrate(ctx, db.Pool)
	require.NoError(t, err)
	require.NotEmpty(t, applied)
	require.NotContains(t, applied, 35)
	waiting, err := schema.Waiting(ctx, db.Pool)
	require.NoError(t, err)
	// 35, then every migration after it (36, 37, and any later one) waits.
	require.GreaterOrEqual(t, len(waiting), 3, "the regular migration after the step waits for it")
	require.Equal(t, 35, waiting[0].Version)
	require.Equal(t, 36, waiting[1].Version)
	require.Equal(t, 37, waiting[2].Version)
	migs, err := schema.Migrations()
	require.NoError(t, err)
	require.Equal(t, migs[len(migs)-1].Version, waiting[len(waiting)-1].Version, "the last migration waits too")
	require.Len(t, waiting, len(migs)-len(applied))

	triggers := func() []string {
		rows, err := db.Pool.Query(ctx, `SELECT tgname::text FROM pg_trigger
			WHERE tgrelid IN ('reminders'::regclass, 'reminder_state'::regclass) AND tgname::text LIKE '%mirror%'
			ORDER BY 1`)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}
	stateIndexes := func() []string {
		// Only reminders' own indexes are described: pg_indexes would
		// describe every index of the database, and one that another test
		// drops meanwhile fails the query ("cache lookup failed").
		rows, err := db.Pool.Query(ctx, `WITH own AS MATERIALIZED (
				SELECT indexrelid FROM pg_index WHERE indrelid = 'reminders'::regclass)
			SELECT indexrelid::regclass::text FROM own
			 WHERE pg_get_indexdef(indexrelid) ~ '\mstate\M'
			 ORDER BY 1`)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return names
	}
	require.Len(t, triggers(), 3, "the mirror runs until the rollout completes")
	require.Len(t, stateIndexes(), 13)

	// Again: nothing new, the step still waits.
	applied, err = schema.Migrate(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, applied)

	waitingVersions := make([]int, 0, len(waiting))
	for _, m := range waiting {
		waitingVersions = append(waitingVersions, m.Version)
	}
	applied, err = schema.MigrateAfterRollout(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, waitingVersions, applied, "35 and every migration after it")
	waiting, err = schema.Waiting(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, waiting)
	require.Empty(t, triggers())
	require.Empty(t, stateIndexes())
	var functions int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc
		WHERE pronamespace = current_schema()::regnamespace AND proname LIKE 'nudge_state_mirror%'`).Scan(&functions))
	require.Zero(t, functions)
	applied, err = schema.Migrate(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, applied)

	// A reminder's state row is written alone now.
	var id int64
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key)
		VALUES ('acme', 'k', 'email', 'a@example.org', 't', '{}', now(), now() + interval '1 hour', 'acme/k') RETURNING id`).Scan(&id))
	var states int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminder_state`).Scan(&states))
	require.Zero(t, states, "no forward mirror")
	_, err = db.Pool.Exec(ctx, `INSERT INTO reminder_state (id, tenant, channel, due_at, deadline)
		SELECT id, tenant, channel, due_at, deadline FROM reminders WHERE id = $1`, id)
	require.NoError(t, err)
	var before string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT row_to_json(r)::text FROM reminders r WHERE id = $1`, id).Scan(&before))
	_, err = db.Pool.Exec(ctx, `UPDATE reminder_state SET state = 'canceled', fence = fence + 1 WHERE id = $1`, id)
	require.NoError(t, err)
	var after string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT row_to_json(r)::text FROM reminders r WHERE id = $1`, id).Scan(&after))
	require.Equal(t, before, after, "no reverse mirror")
	require.NotContains(t, after, `"state"`, "37 dropped the wide row's copy of the state")
}
