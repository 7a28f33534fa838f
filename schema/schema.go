// Package schema holds Nudge's versioned PostgreSQL migrations, embedded in
// every binary, and applies them. Migrate is idempotent and safe while the
// fleet runs: an advisory lock serialises concurrent runs, each migration
// applies in its own transaction together with its version row, and a version
// already recorded is never applied again.
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
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/sqlfile"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

//go:embed backfill.sql
var backfillSQL string

var backfillQueries = sqlfile.Parse("backfill.sql", backfillSQL)

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
// reports what it left.
func Migrate(ctx context.Context, db pg.Beginner) ([]int, error) {
	return migrate(ctx, db, false)
}

// MigrateAfterRollout applies every embedded migration not yet recorded,
// after-rollout ones included: run it only once no binary of the previous
// release runs.
func MigrateAfterRollout(ctx context.Context, db pg.Beginner) ([]int, error) {
	return migrate(ctx, db, true)
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

func migrate(ctx context.Context, db pg.Beginner, afterRollout bool) ([]int, error) {
	run, _, err := plan(ctx, db, afterRollout)
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
		did, err := applyRetryingDeadlocks(ctx, db, m)
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
	stmt := backfillQueries.Get("BackfillState")
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

// deadlockDetected is PostgreSQL's SQLSTATE for a transaction aborted to
// break a deadlock.
const deadlockDetected = "40P01"

// deadlockAttempts bounds how often a migration chosen as a deadlock's
// victim is run again.
const deadlockAttempts = 5

// applyRetryingDeadlocks applies m, and applies it again when PostgreSQL
// aborted it to break a deadlock with the running fleet (a migration that
// locks two tables, or upgrades a lock, can meet a fleet transaction that
// takes them in the other order). The aborted transaction changed nothing,
// so running it again is safe; the fleet's transaction it waited on has
// gone on by then. Write migrations to take their strongest table lock
// first anyway (0036's comment): this is the net under them.
func applyRetryingDeadlocks(ctx context.Context, db pg.Beginner, m Migration) (bool, error) {
	for attempt := 1; ; attempt++ {
		did, err := apply(ctx, db, m)
		if err == nil || !retryMigration(err, attempt) {
			return did, err
		}
	}
}

// retryMigration says whether a migration that failed with err on its
// attempt-th try is run again: only a deadlock's victim, and at most
// deadlockAttempts times in all.
func retryMigration(err error, attempt int) bool {
	var pgErr *pgconn.PgError
	return attempt < deadlockAttempts && errors.As(err, &pgErr) && pgErr.Code == deadlockDetected
}

func apply(ctx context.Context, db pg.Beginner, m Migration) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migration %04d: begin: %w", m.Version, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit

	// Held until commit: a second Migrate waits here, then sees the version.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(advisoryLockKey)); err != nil {
		return false, fmt.Errorf("migration %04d: taking the migration lock: %w", m.Version, err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS nudge_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return false, fmt.Errorf("migration %04d: creating nudge_migrations: %w", m.Version, err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nudge_migrations WHERE version = $1)`,
		m.Version).Scan(&exists); err != nil {
		return false, fmt.Errorf("migration %04d: reading applied versions: %w", m.Version, err)
	}
	if exists {
		return false, nil
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return false, fmt.Errorf("migration %s: %w", m, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO nudge_migrations (version, name) VALUES ($1, $2)`,
		m.Version, m.Name); err != nil {
		return false, fmt.Errorf("migration %04d: recording version: %w", m.Version, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("migration %04d: commit: %w", m.Version, err)
	}
	return true, nil
}
