package schema

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/pg"
)

// Defaults of Options.
const (
	// DefaultLockTimeout bounds each wait of a migration for a lock. A
	// catalogue change holds its ACCESS EXCLUSIVE lock for milliseconds;
	// while it waits for one, every later lock request on that table
	// (intake, claims, outcomes) queues behind it, so the fleet stalls for
	// at most this long per attempt.
	DefaultLockTimeout = 2 * time.Second
	// DefaultLockWait bounds how long Migrate keeps retrying a migration
	// that could not get its locks before it gives up.
	DefaultLockWait = 5 * time.Minute
)

// The pause between two attempts of a migration that could not get its
// locks: lockPauseFirst, doubling up to lockPauseMax.
const (
	lockPauseFirst = 500 * time.Millisecond
	lockPauseMax   = 8 * time.Second
)

// Options bound how long applying a migration may keep the running fleet
// waiting behind it. A migration that changes the catalogue takes an ACCESS
// EXCLUSIVE lock; PostgreSQL queues every later request for any lock on that
// table behind the waiting request, so a migration that waits for a long
// transaction (an application's batch import holding intake's ROW EXCLUSIVE
// lock for an hour) would stall every intake, claim and outcome on the table
// as long. With Options, once the migration lock is held each migration runs
// with lock_timeout LockTimeout; a migration that times out (SQLSTATE 55P03)
// is rolled back, which releases the queue, and applied again after a pause,
// until LockWait has passed.
type Options struct {
	// LockTimeout is the lock_timeout of a migration's statements. Zero:
	// DefaultLockTimeout. The wait for the migration lock (a second
	// Migrate waiting for the first) is never bounded.
	LockTimeout time.Duration
	// LockWait bounds the time from a migration's first attempt after which
	// one that timed out on a lock is not tried again, and Migrate fails
	// with a *LockWaitError. Measured on Clock. Zero: DefaultLockWait.
	LockWait time.Duration
	// Clock times LockWait and the pauses between attempts. Nil: the wall
	// clock.
	Clock clock.Clock
	// Progress receives a line for every attempt that failed and is
	// retried, saying why and when it is tried again (nudgectl migrate
	// prints them). Nil: discarded.
	Progress io.Writer

	// migrations replaces the embedded migrations (tests: export_test.go).
	// Nil: Migrations().
	migrations []Migration
}

// Validate reports settings an operator got wrong.
func (o Options) Validate() error {
	if o.LockTimeout < 0 {
		return fmt.Errorf("lock timeout %s: must not be negative", o.LockTimeout)
	}
	if o.LockWait < 0 {
		return fmt.Errorf("lock wait %s: must not be negative", o.LockWait)
	}
	return nil
}

// Migrate is the package's Migrate with these bounds.
func (o Options) Migrate(ctx context.Context, db pg.Beginner) ([]int, error) {
	return o.migrate(ctx, db, false)
}

// MigrateAfterRollout is the package's MigrateAfterRollout with these
// bounds.
func (o Options) MigrateAfterRollout(ctx context.Context, db pg.Beginner) ([]int, error) {
	return o.migrate(ctx, db, true)
}

func (o Options) lockTimeout() time.Duration {
	if o.LockTimeout == 0 {
		return DefaultLockTimeout
	}
	return o.LockTimeout
}

func (o Options) lockWait() time.Duration {
	if o.LockWait == 0 {
		return DefaultLockWait
	}
	return o.LockWait
}

func (o Options) clock() clock.Clock {
	if o.Clock == nil {
		return clock.Real{}
	}
	return o.Clock
}

func (o Options) progress(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

// PostgreSQL's SQLSTATEs that make a migration run again.
const (
	// deadlockDetected: the transaction was aborted to break a deadlock.
	deadlockDetected = "40P01"
	// lockNotAvailable: a lock was not granted within lock_timeout.
	lockNotAvailable = "55P03"
)

// deadlockAttempts bounds how often a migration chosen as a deadlock's
// victim is run again.
const deadlockAttempts = 5

// LockWaitError is Migrate's failure when a migration could not get its
// locks within Options.LockWait: another transaction held a lock on a table
// it changes the whole time. Nothing of the migration was applied.
type LockWaitError struct {
	// Migration is the migration that was not applied.
	Migration Migration
	// Table is the table PostgreSQL's last error named, if it named one.
	Table string
	// Holders describes the sessions whose transactions held a lock on a
	// table of the schema when the migration last timed out (empty when
	// none could be read).
	Holders []string
	// Attempts is how many times the migration was tried; Waited how long
	// from the first attempt until it gave up (on Options.Clock).
	Attempts int
	Waited   time.Duration
	// Err is the last attempt's error.
	Err error
}

func (e *LockWaitError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "migration %s not applied: it could not get its locks", e.Migration)
	if e.Table != "" {
		fmt.Fprintf(&b, " (on %s)", e.Table)
	}
	fmt.Fprintf(&b, " in %d attempts over %s, as another transaction kept a lock on the table", e.Attempts,
		e.Waited.Round(time.Millisecond))
	if len(e.Holders) > 0 {
		fmt.Fprintf(&b, "; held by %s", strings.Join(e.Holders, "; "))
	}
	fmt.Fprintf(&b, ". Find the long transaction (SELECT pid, now() - xact_start AS open, state, query FROM pg_stat_activity "+
		"WHERE datname = current_database() ORDER BY xact_start LIMIT 5), let it finish or end it "+
		"(pg_terminate_backend(pid)), then re-run nudgectl migrate (--lock-wait waits longer): %v", e.Err)
	return b.String()
}

func (e *LockWaitError) Unwrap() error { return e.Err }

// applyRetrying applies m, and applies it again when PostgreSQL aborted it
// to break a deadlock with the running fleet (a migration that locks two
// tables, or upgrades a lock, can meet a fleet transaction that takes them
// in the other order; write migrations to take their strongest table lock
// first anyway, 0036's comment: this is the net under them), or when it
// waited for a lock longer than the lock timeout (a long transaction holds
// one on a table it changes). Either aborted transaction changed nothing,
// so running it again is safe. A deadlock's victim runs again at once (the
// fleet's transaction it waited on has gone on by then), at most
// deadlockAttempts times in all; a lock timeout after a pause (lockPause),
// until Options.LockWait has passed.
func (o Options) applyRetrying(ctx context.Context, db pg.Beginner, m Migration) (bool, error) {
	clk := o.clock()
	start := clk.Now()
	deadlocks, timeouts := 0, 0
	for attempt := 1; ; attempt++ {
		did, err := apply(ctx, db, m, o.lockTimeout())
		if err == nil {
			return did, nil
		}
		switch code := sqlState(err); code {
		case deadlockDetected:
			deadlocks++
			if !retryDeadlock(err, deadlocks) {
				return false, err
			}
			o.progress("migration %s: aborted to break a deadlock with a running transaction; nothing applied, "+
				"retrying at once (deadlock %d of at most %d)", m, deadlocks, deadlockAttempts-1)
		case lockNotAvailable:
			timeouts++
			waited := clk.Now().Sub(start)
			table := lockedTable(err)
			holders := lockHolders(ctx, db, o.lockTimeout())
			pause, retry := lockPause(timeouts, waited, o.lockWait())
			if !retry {
				return false, &LockWaitError{Migration: m, Table: table, Holders: holders, Attempts: attempt,
					Waited: waited, Err: err}
			}
			on := ""
			if table != "" {
				on = " on " + table
			}
			held := ""
			if len(holders) > 0 {
				held = ": " + strings.Join(holders, "; ")
			}
			o.progress("migration %s: no lock%s within the lock timeout of %s: another transaction holds one%s. "+
				"Rolled back, so the fleet's statements go on; retrying in %s (attempt %d, %s of --lock-wait %s used)",
				m, on, o.lockTimeout(), held, pause, attempt+1, waited.Round(time.Millisecond), o.lockWait())
			if err := clock.Sleep(ctx, clk, pause); err != nil {
				return false, fmt.Errorf("migration %s: waiting to retry after a lock timeout: %w", m, err)
			}
		default:
			return did, err
		}
	}
}

// sqlState is err's SQLSTATE, "" when PostgreSQL did not raise it.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// retryDeadlock says whether a migration that failed with err, its
// deadlocks-th deadlock, is run again: only a deadlock's victim, and at most
// deadlockAttempts times in all.
func retryDeadlock(err error, deadlocks int) bool {
	return deadlocks < deadlockAttempts && sqlState(err) == deadlockDetected
}

// lockPause is the pause before the next attempt of a migration whose
// timeouts-th attempt timed out on a lock, waited after its first attempt
// began: lockPauseFirst, doubling up to lockPauseMax, and never past wait
// (the last attempt starts when wait has passed). retry is false once
// waited reaches wait.
func lockPause(timeouts int, waited, wait time.Duration) (pause time.Duration, retry bool) {
	if waited >= wait {
		return 0, false
	}
	pause = lockPauseFirst
	for i := 1; i < timeouts && pause < lockPauseMax; i++ {
		pause *= 2
	}
	return min(pause, lockPauseMax, wait-waited), true
}

// relationInContext finds the relation PostgreSQL's error context names
// ("while locking tuple (0,1) in relation \"nudge_promoter\"").
var relationInContext = regexp.MustCompile(`relation "([^"]+)"`)

// lockedTable is the table a lock timeout names, "" when PostgreSQL's
// error does not (a table lock's timeout says only "canceling statement due
// to lock timeout"; a row lock's names the relation in its context).
func lockedTable(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	if pgErr.TableName != "" {
		return pgErr.TableName
	}
	if m := relationInContext.FindStringSubmatch(pgErr.Where); m != nil {
		return m[1]
	}
	return ""
}

// lockHolders describes, best effort, the sessions whose transactions,
// open for longer than older, hold locks on tables of db's schema
// (queries.sql, LockHolders): "pid 4711 (idle in transaction, open 13m0s,
// locks reminders)". Nil when none is found or they cannot be read: the
// error that reports them must not fail for it.
func lockHolders(ctx context.Context, db pg.Beginner, older time.Duration) []string {
	rows, err := db.Query(ctx, queries.Get("LockHolders"),
		pgx.NamedArgs{"older": fmt.Sprintf("%d milliseconds", older.Milliseconds())})
	if err != nil {
		return nil
	}
	var out []string
	for rows.Next() {
		var (
			pid         int32
			tables      string
			state       string
			openSeconds float64
		)
		if err := rows.Scan(&pid, &tables, &state, &openSeconds); err != nil {
			rows.Close()
			return nil
		}
		var what []string
		if state != "" {
			what = append(what, state)
		}
		if openSeconds >= 0 {
			what = append(what, "open "+time.Duration(openSeconds*float64(time.Second)).Round(time.Second).String())
		}
		what = append(what, "locks "+tables)
		out = append(out, fmt.Sprintf("pid %d (%s)", pid, strings.Join(what, ", ")))
	}
	if rows.Err() != nil {
		return nil
	}
	return out
}

// migrationDeadlockTimeout is the deadlock_timeout of a migration's
// transaction, below the server's (1 s by default) so that in a deadlock
// with the running fleet the migration is the one that looks first and
// aborts itself: applyRetrying runs it again, and the fleet's transaction
// goes on without an error. PostgreSQL checks for a deadlock in the process
// that has waited deadlock_timeout, and aborts that one; a fleet statement
// that began waiting on the migration's first lock just before the
// migration waited for its second (TestRollingUpgrade met it: the
// reconciler reads reminder_state then reminders, schema 44 locks them the
// other way) would otherwise look first and be the victim.
const migrationDeadlockTimeout = 100 * time.Millisecond

// shortDeadlockTimeout sets migrationDeadlockTimeout for the rest of tx, if
// the role may: deadlock_timeout is a superuser's setting unless granted
// (GRANT SET ON PARAMETER deadlock_timeout TO the migrating role,
// docs/deploy.md). Refused, it leaves the server's and says nothing: the
// migration still retries as a victim, the fleet's statement as its own
// next attempt.
func shortDeadlockTimeout(ctx context.Context, tx pgx.Tx) error {
	sp, err := tx.Begin(ctx) // a savepoint: a refusal must not abort tx
	if err != nil {
		return fmt.Errorf("setting deadlock_timeout: %w", err)
	}
	if _, err := sp.Exec(ctx, `SELECT set_config('deadlock_timeout', $1, true)`,
		fmt.Sprintf("%dms", migrationDeadlockTimeout.Milliseconds())); err != nil {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return fmt.Errorf("setting deadlock_timeout: %w", rerr)
		}
		return nil
	}
	if err := sp.Commit(ctx); err != nil {
		return fmt.Errorf("setting deadlock_timeout: %w", err)
	}
	return nil
}

// apply applies m in one transaction with its version row, unless a
// concurrent run recorded it first. The migration lock is waited for without
// bound; every statement after it waits for a lock at most lockTimeout.
func apply(ctx context.Context, db pg.Beginner, m Migration, lockTimeout time.Duration) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migration %04d: begin: %w", m.Version, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit

	// Held until commit: a second Migrate waits here, then sees the version.
	// Unbounded even when the login or --database-url sets a lock_timeout.
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = 0`); err != nil {
		return false, fmt.Errorf("migration %04d: clearing lock_timeout: %w", m.Version, err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(advisoryLockKey)); err != nil {
		return false, fmt.Errorf("migration %04d: taking the migration lock: %w", m.Version, err)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`,
		fmt.Sprintf("%dms", max(lockTimeout.Milliseconds(), 1))); err != nil {
		return false, fmt.Errorf("migration %04d: setting lock_timeout: %w", m.Version, err)
	}
	if err := shortDeadlockTimeout(ctx, tx); err != nil {
		return false, fmt.Errorf("migration %04d: %w", m.Version, err)
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
