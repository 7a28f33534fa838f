// Package schema holds Nudge's versioned PostgreSQL migrations, embedded in
// every binary, and applies them. Migrate is idempotent and safe while the
// fleet runs: an advisory lock serialises concurrent runs, each migration
// applies in its own transaction together with its version row, a version
// already recorded is never applied again, and a migration waits for a table
// lock only briefly, retrying, so the fleet never queues behind it for long
// (Options).
//
// A migration whose file name ends in .after-rollout.sql
// (NNNN_name.after-rollout.sql) is the contract step of a rolling change: it
// removes what only the previous release's binaries need, so it may run only
// once every component runs this release. Migrate stops before the first such
// migration not yet applied, and applies nothing after it (a later migration
// may build on it); MigrateAfterRollout applies everything.
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/sqlfile"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// The statements Migrate runs besides the migrations themselves: the
// pre-steps' backfills and the lock holders a timed-out lock wait names.
//
//go:embed queries.sql
var queriesSQL string

var queries = sqlfile.Parse("queries.sql", queriesSQL)

// Migration is one versioned schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
	// AfterRollout marks a migration that must wait until no binary of the
	// previous release runs (file name NNNN_name.after-rollout.sql).
	AfterRollout bool
}

// afterRolloutSuffix ends the name of an after-rollout migration's file
// (before .sql).
const afterRolloutSuffix = ".after-rollout"

// String names the migration as its file does, without .sql.
func (m Migration) String() string {
	if m.AfterRollout {
		return fmt.Sprintf("%04d_%s%s", m.Version, m.Name, afterRolloutSuffix)
	}
	return fmt.Sprintf("%04d_%s", m.Version, m.Name)
}

// advisoryLockKey is an arbitrary constant shared by every Migrate call
// ("nudge" in ASCII), scoped to the current database.
const advisoryLockKey = 0x6e75646765

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("reading embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		base := strings.TrimSuffix(name, ".sql")
		after := strings.HasSuffix(base, afterRolloutSuffix)
		num, rest, ok := strings.Cut(strings.TrimSuffix(base, afterRolloutSuffix), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || rest == "" || strings.Contains(rest, ".") {
			return nil, fmt.Errorf("migration file %q: name must be NNNN_description.sql or NNNN_description%s.sql",
				name, afterRolloutSuffix)
		}
		body, err := migrationFiles.ReadFile("migrations/" + name)
		if err != nil {
			return nil, fmt.Errorf("reading migration %q: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: rest, SQL: string(body), AfterRollout: after})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("two migrations with version %d", out[i].Version)
		}
	}
	return out, nil
}

// Migrate applies the embedded migrations not yet recorded in the
// nudge_migrations table of the current search_path schema, in version
// order, up to the first after-rollout migration not yet applied, and
// returns the versions it applied (empty when already up to date). Waiting
// reports what it left. Its lock waits are bounded as by Options' zero
// value.
func Migrate(ctx context.Context, db pg.Beginner) ([]int, error) {
	return Options{}.Migrate(ctx, db)
}

// MigrateAfterRollout applies every embedded migration not yet recorded,
// after-rollout ones included: run it only once no binary of the previous
// release runs.
func MigrateAfterRollout(ctx context.Context, db pg.Beginner) ([]int, error) {
	return Options{}.MigrateAfterRollout(ctx, db)
}

// Waiting returns the migrations not yet applied that Migrate leaves for
// MigrateAfterRollout: the first after-rollout one not applied and every
// one not applied after it (empty when none waits).
func Waiting(ctx context.Context, db pg.Beginner) ([]Migration, error) {
	_, waiting, err := plan(ctx, db, false)
	return waiting, err
}

// Fresh reports whether db records no applied migration: a database no
// release has run on. No binary of an earlier release can be running
// against it, so nothing an after-rollout migration removes is in use:
// nudgectl migrate applies them too, which a fresh install then needs no
// second step for.
func Fresh(ctx context.Context, db pg.Beginner) (bool, error) {
	done, err := appliedVersions(ctx, db)
	if err != nil {
		return false, err
	}
	return len(done) == 0, nil
}

// plan is Plan over the embedded migrations and the versions db records.
func plan(ctx context.Context, db pg.Beginner, afterRollout bool) (run, waiting []Migration, err error) {
	migs, err := Migrations()
	if err != nil {
		return nil, nil, err
	}
	return planOf(ctx, db, migs, afterRollout)
}

// planOf is Plan over migs and the versions db records.
func planOf(ctx context.Context, db pg.Beginner, migs []Migration, afterRollout bool) (run, waiting []Migration, err error) {
	done, err := appliedVersions(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	run, waiting = Plan(migs, done, afterRollout)
	return run, waiting, nil
}

// Plan splits migs (in version order) into the ones not in applied that a
// run applies now, in order, and the ones not in applied that wait. Without
// afterRollout the run stops at the first after-rollout migration not
// applied: it and every migration not applied after it wait (a later
// migration may depend on it, so none is applied past it). With
// afterRollout nothing waits.
func Plan(migs []Migration, applied map[int]bool, afterRollout bool) (run, waiting []Migration) {
	for _, m := range migs {
		if applied[m.Version] {
			continue
		}
		if len(waiting) > 0 || (m.AfterRollout && !afterRollout) {
			waiting = append(waiting, m)
			continue
		}
		run = append(run, m)
	}
	return run, waiting
}

func (o Options) migrate(ctx context.Context, db pg.Beginner, afterRollout bool) ([]int, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	migs := o.migrations
	if migs == nil {
		var err error
		if migs, err = Migrations(); err != nil {
			return nil, err
		}
	}
	run, _, err := planOf(ctx, db, migs, afterRollout)
	if err != nil {
		return nil, err
	}
	var applied []int
	for _, m := range run {
		if pre, ok := preSteps[m.Version]; ok {
			if err := runPreStep(ctx, db, m, pre); err != nil {
				return applied, err
			}
		}
		// apply checks again under the lock: a concurrent run may have
		// applied it since.
		did, err := o.applyRetrying(ctx, db, m)
		if err != nil {
			return applied, err
		}
		if did {
			applied = append(applied, m.Version)
		}
	}
	return applied, nil
}

// appliedVersions reads the recorded versions (none when nudge_migrations
// does not exist yet).
func appliedVersions(ctx context.Context, db pg.Beginner) (map[int]bool, error) {
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('nudge_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("reading applied versions: %w", err)
	}
	done := map[int]bool{}
	if !exists {
		return done, nil
	}
	rows, err := db.Query(ctx, `SELECT version FROM nudge_migrations`)
	if err != nil {
		return nil, fmt.Errorf("reading applied versions: %w", err)
	}
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("reading applied versions: %w", err)
	}
	for _, v := range vs {
		done[v] = true
	}
	return done, nil
}

// preStep is work a migration needs done first that must not run inside one
// transaction: copying every row of a large table would hold its locks,
// and make the running fleet's writes wait, for the whole copy. It runs in
// batches, each its own transaction, before its migration is applied, and
// is idempotent, so a Migrate that stopped half way resumes it; the
// migration itself then checks the result.
type preStep func(ctx context.Context, db pg.Beginner) error

// preSteps maps a migration version to the step that runs before it.
//
// A step runs without Options' lock_timeout: none takes a lock that queues
// the fleet behind it. backfillState's batches take ROW EXCLUSIVE on
// reminder_state and ACCESS SHARE on reminders, which conflict with nothing
// intake, claims or outcomes take, and tuple locks on the rows they copy: a
// batch that waits for a row a long transaction holds keeps the rows it
// locked before it share-locked meanwhile (writes to those rows wait, not
// the table's).
var preSteps = map[int]preStep{
	33: backfillState,
}

// runPreStep runs m's step: m is not applied yet (a Migrate running at the
// same time may run the step too, or have applied m meanwhile: the step is
// idempotent, and apply checks the version again under the lock).
func runPreStep(ctx context.Context, db pg.Beginner, m Migration, pre preStep) error {
	if err := pre(ctx, db); err != nil {
		return fmt.Errorf("before migration %s: %w", m, err)
	}
	return nil
}

// backfillBatch bounds each backfill transaction: ~10,000 rows hold the
// running fleet's writes to those rows for a fraction of a second.
const backfillBatch = 10000

// backfillState copies into reminder_state the reminders that predate
// migration 0032, batch by batch in id order.
func backfillState(ctx context.Context, db pg.Beginner) error {
	stmt := queries.Get("BackfillState")
	after := int64(0)
	for {
		// One statement, so one transaction per batch.
		var last *int64
		err := db.QueryRow(ctx, stmt, pgx.NamedArgs{"after": after, "size": backfillBatch}).Scan(&last)
		if err != nil {
			return fmt.Errorf("backfilling reminder_state after id %d: %w", after, err)
		}
		if last == nil {
			return nil
		}
		after = *last
	}
}
