package schema_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/schema"
)

// lockedBuffer is a bytes.Buffer that Migrate's goroutine writes while the
// test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// migrateResult is what a Migrate running in a goroutine returned.
type migrateResult struct {
	applied []int
	err     error
}

// lockProbe is a test-only migration that changes reminders' catalogue, as
// 0037 does: it needs ACCESS EXCLUSIVE on the table for milliseconds.
var lockProbe = schema.Migration{Version: 9001, Name: "lock_probe",
	SQL: `ALTER TABLE reminders ADD COLUMN lock_probe integer`}

// intakeInsert writes one reminder as intake does (ROW EXCLUSIVE on
// reminders), key k.
const intakeInsert = `INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key)
	VALUES ('acme', $1, 'email', 'a@example.org', 't', '{}', now() + interval '1 day', now() + interval '2 days', 'acme/' || $1)`

// lockSetup is a schema with a reminders table and a long transaction open
// on it (a batch import's intake, not committed), and Options applying
// lockProbe on a fake clock. The table is reminders' identity and intent
// columns only: the locks are the same as on the migrated table, and the
// test does not pay for (and queue on the machine's migration lock for) a
// whole migration.
type lockSetup struct {
	db       *testenv.DB
	blocker  pgx.Tx
	fake     *clock.Fake
	progress *lockedBuffer
	opts     schema.Options
}

func newLockSetup(t *testing.T, lockTimeout, lockWait time.Duration) *lockSetup {
	t.Helper()
	db := testenv.EmptyPostgres(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE reminders (id bigserial PRIMARY KEY, tenant text NOT NULL,
		key text NOT NULL, channel text NOT NULL, recipient text NOT NULL, template text NOT NULL, data jsonb NOT NULL,
		due_at timestamptz NOT NULL, deadline timestamptz NOT NULL, idempotency_key text NOT NULL, UNIQUE (tenant, key));
		CREATE TABLE nudge_migrations (version integer PRIMARY KEY, name text NOT NULL,
		                               applied_at timestamptz NOT NULL DEFAULT now())`)
	require.NoError(t, err)
	blocker, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = blocker.Rollback(context.Background()) })
	_, err = blocker.Exec(ctx, intakeInsert, "import-1")
	require.NoError(t, err)
	s := &lockSetup{db: db, blocker: blocker, fake: clock.NewFake(time.Now()), progress: &lockedBuffer{}}
	s.opts = schema.WithMigrations(schema.Options{LockTimeout: lockTimeout, LockWait: lockWait, Clock: s.fake,
		Progress: s.progress}, []schema.Migration{lockProbe})
	return s
}

// start runs Migrate in a goroutine.
func (s *lockSetup) start() <-chan migrateResult { return startMigrate(s.opts, s.db) }

// startMigrate runs opts' Migrate on db in a goroutine.
func startMigrate(opts schema.Options, db *testenv.DB) <-chan migrateResult {
	done := make(chan migrateResult, 1)
	go func() {
		applied, err := opts.Migrate(context.Background(), db.Pool)
		done <- migrateResult{applied, err}
	}()
	return done
}

// awaitMigrate is what the Migrate running in a goroutine returns, once
// what it waited for (after) is gone.
func awaitMigrate(t *testing.T, done <-chan migrateResult, after string) migrateResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(8 * time.Second):
		t.Fatalf("migrate did not return after %s", after)
		return migrateResult{}
	}
}

// awaitLockRequest waits until a lock request on table waits in its queue.
func awaitLockRequest(t *testing.T, db *testenv.DB, table, why string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE relation = $1::regclass AND NOT granted)`, table).Scan(&waiting))
		return waiting
	}, 8*time.Second, 5*time.Millisecond, why)
}

// awaitProgress waits until Migrate's progress says want.
func awaitProgress(t *testing.T, progress *lockedBuffer, want string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(progress.String(), want) },
		8*time.Second, 5*time.Millisecond, "progress says %q", want)
}

// waitPaused waits until Migrate pauses between two attempts (on the fake
// clock), failing if it returned instead.
func (s *lockSetup) waitPaused(t *testing.T, done <-chan migrateResult) {
	t.Helper()
	require.Eventually(t, func() bool {
		select {
		case r := <-done:
			t.Fatalf("migrate returned %v, %v while the blocker was open", r.applied, r.err)
		default:
		}
		return s.fake.Waiters() == 1
	}, 8*time.Second, 5*time.Millisecond, "migrate pauses after a lock timeout")
}

// recorded reports whether lockProbe is applied: recorded, and its column
// there.
func (s *lockSetup) recorded(t *testing.T) (version, column bool) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nudge_migrations WHERE version = $1)`,
		lockProbe.Version).Scan(&version))
	require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = 'reminders'::regclass AND attname = 'lock_probe' AND NOT attisdropped)`).Scan(&column))
	return version, column
}

// The hazard: a migration waiting for ACCESS EXCLUSIVE on reminders behind
// a long transaction queues every later lock request on the table, intake's
// included, for as long as that transaction runs. With the lock timeout, an
// intake that arrives while the migration waits goes through once the
// migration's attempt times out (within the timeout, not the long
// transaction's hour); the migration rolls back, says so, tries again after
// a pause, and applies once the long transaction has committed.
//
// Without the lock timeout (apply's set_config removed) this test fails:
// the third session's insert stays queued until its 5 s bound.
func TestMigrationLockTimeoutKeepsIntakeFlowing(t *testing.T) {
	t.Parallel()
	const lockTimeout = time.Second
	s := newLockSetup(t, lockTimeout, time.Minute)
	ctx := context.Background()
	done := s.start()

	// The migration's request waits in the lock queue of reminders.
	awaitLockRequest(t, s.db, "reminders", "the migration waits for its lock")

	// A third session's intake, as the web tier's: it is queued behind the
	// migration's request, and released when that request times out.
	intakeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	began := time.Now()
	_, err := s.db.Pool.Exec(intakeCtx, intakeInsert, "web-1")
	took := time.Since(began)
	require.NoError(t, err, "intake goes on while the long transaction runs")
	require.Less(t, took, lockTimeout+2*time.Second, "held at most about the lock timeout")

	s.waitPaused(t, done)
	require.Contains(t, s.progress.String(), "migration 9001_lock_probe: no lock")
	require.Contains(t, s.progress.String(), "retrying in 500ms (attempt 2")
	require.Contains(t, s.progress.String(), "locks reminders", "names the long transaction's table")
	t.Log(s.progress.String())

	// Still blocked: the second attempt times out too, and pauses longer.
	s.fake.Advance(500 * time.Millisecond)
	awaitProgress(t, s.progress, "retrying in 1s (attempt 3")
	s.waitPaused(t, done)
	version, column := s.recorded(t)
	require.False(t, version || column, "nothing applied while the blocker runs")

	// The import commits; the next attempt applies.
	require.NoError(t, s.blocker.Commit(ctx))
	s.fake.Advance(time.Second)
	r := awaitMigrate(t, done, "the blocker committed")
	require.NoError(t, r.err)
	require.Equal(t, []int{lockProbe.Version}, r.applied)
	version, column = s.recorded(t)
	require.True(t, version && column, "applied and recorded")
	var rows int
	require.NoError(t, s.db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminders WHERE key IN ('import-1', 'web-1')`).Scan(&rows))
	require.Equal(t, 2, rows, "both intakes kept")
}

// A long transaction that outlasts --lock-wait: migrate gives up with an
// error that names the migration, the session holding the table and what
// to do, and records nothing.
func TestMigrationLockWaitGivesUpClearly(t *testing.T) {
	t.Parallel()
	s := newLockSetup(t, 200*time.Millisecond, 2*time.Second)
	done := s.start()

	// Each pause ends at once: the fake clock moves 8 s whenever migrate
	// waits on it.
	var r migrateResult
	require.Eventually(t, func() bool {
		select {
		case r = <-done:
			return true
		default:
			if s.fake.Waiters() == 1 {
				s.fake.Advance(8 * time.Second)
			}
			return false
		}
	}, 8*time.Second, 5*time.Millisecond, "migrate gives up")
	require.Error(t, r.err)
	require.Empty(t, r.applied)
	var lwe *schema.LockWaitError
	require.True(t, errors.As(r.err, &lwe), "got %v", r.err)
	require.Equal(t, lockProbe.Version, lwe.Migration.Version)
	require.Equal(t, 2, lwe.Attempts, "a pause of 0.5 s moved the fake clock past the 2 s budget")
	msg := r.err.Error()
	t.Log(msg)
	for _, want := range []string{"migration 9001_lock_probe not applied", "locks reminders", "idle in transaction",
		"pg_stat_activity", "re-run nudgectl migrate", "--lock-wait", "lock timeout"} {
		require.Contains(t, msg, want)
	}
	version, column := s.recorded(t)
	require.False(t, version || column, "nothing applied or recorded")
}

// A migration chosen as a deadlock's victim is still run again at once: it
// locks lt_a then lt_b, a fleet transaction holds lt_b and then wants lt_a.
// PostgreSQL aborts the migration (its deadlock_timeout, 1 s, ends first;
// the lock timeout is longer here, so the deadlock is found before it), the
// fleet's transaction goes on, and the retry applies once it commits.
func TestMigrationDeadlockStillRetried(t *testing.T) {
	t.Parallel()
	db := testenv.EmptyPostgres(t)
	ctx := context.Background()
	d := newDeadlockSetup(t, db, schema.Migration{Version: 9002, Name: "two_tables",
		SQL: `LOCK TABLE lt_a IN ACCESS EXCLUSIVE MODE; LOCK TABLE lt_b IN ACCESS EXCLUSIVE MODE;
		      ALTER TABLE lt_a ADD COLUMN x int`})
	done := startMigrate(d.opts, db)
	awaitLockRequest(t, db, "lt_b", "the migration holds lt_a and waits for lt_b")
	_, err := d.fleet.Exec(ctx, `INSERT INTO lt_a VALUES (1)`)
	require.NoError(t, err, "the fleet's transaction is not the victim")
	d.awaitRetriedAfterCommit(t, done, 9002)
}

// deadlockSetup is a deadlock test's two tables (lt_a, lt_b), its one
// migration's options (on a fake clock, progress recorded) and a fleet
// transaction that holds a row of lt_b.
type deadlockSetup struct {
	opts     schema.Options
	progress *lockedBuffer
	fleet    pgx.Tx
}

func newDeadlockSetup(t *testing.T, db *testenv.DB, m schema.Migration) deadlockSetup {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE lt_a (id int); CREATE TABLE lt_b (id int)`)
	require.NoError(t, err)
	d := deadlockSetup{progress: &lockedBuffer{}}
	d.opts = schema.WithMigrations(schema.Options{LockTimeout: 5 * time.Second, Clock: clock.NewFake(time.Now()),
		Progress: d.progress}, []schema.Migration{m})
	d.fleet, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.fleet.Rollback(context.Background()) }) // committed by the test
	_, err = d.fleet.Exec(ctx, `INSERT INTO lt_b VALUES (1)`)
	require.NoError(t, err)
	return d
}

// awaitRetriedAfterCommit waits until the migration says it was a
// deadlock's victim, commits the fleet's transaction, and checks the retry
// applied version.
func (d deadlockSetup) awaitRetriedAfterCommit(t *testing.T, done <-chan migrateResult, version int) {
	t.Helper()
	awaitProgress(t, d.progress, "aborted to break a deadlock")
	require.NoError(t, d.fleet.Commit(context.Background()))
	r := awaitMigrate(t, done, "the fleet's transaction committed")
	require.NoError(t, r.err)
	require.Equal(t, []int{version}, r.applied)
}

// The other way round, as TestRollingUpgrade met it: a fleet statement waits
// on the migration's first lock before the migration waits for its second,
// which the fleet holds. With the server's deadlock_timeout on both sides
// the fleet, waiting longer, would look first and be the victim; the
// migration's shorter one (migrationDeadlockTimeout) makes it look first and
// abort itself, so the fleet's statement succeeds and the migration is
// applied once the fleet commits. An advisory lock the test holds orders
// the steps: the migration takes lt_a, then waits for it before lt_b.
func TestMigrationIsTheVictimWhenTheFleetWaitedFirst(t *testing.T) {
	t.Parallel()
	db := testenv.EmptyPostgres(t)
	ctx := context.Background()
	d := newDeadlockSetup(t, db, schema.Migration{Version: 9003, Name: "two_tables_gated",
		SQL: `LOCK TABLE lt_a IN ACCESS EXCLUSIVE MODE; SELECT pg_advisory_xact_lock(9003);
		      LOCK TABLE lt_b IN ACCESS EXCLUSIVE MODE; ALTER TABLE lt_a ADD COLUMN x int`})
	gate, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer gate.Rollback(ctx) //nolint:errcheck // rolled back below
	_, err = gate.Exec(ctx, `SELECT pg_advisory_xact_lock(9003)`)
	require.NoError(t, err)
	done := startMigrate(d.opts, db)
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE locktype = 'advisory' AND objid = 9003 AND NOT granted)`).Scan(&waiting))
		return waiting
	}, 8*time.Second, 5*time.Millisecond, "the migration holds lt_a and waits at the gate")
	fleetDone := make(chan error, 1)
	go func() {
		_, err := d.fleet.Exec(ctx, `INSERT INTO lt_a VALUES (1)`)
		fleetDone <- err
	}()
	awaitLockRequest(t, db, "lt_a", "the fleet waits for lt_a, first")
	require.NoError(t, gate.Rollback(ctx)) // the migration goes on to lt_b
	require.NoError(t, <-fleetDone, "the fleet's statement is not the victim")
	d.awaitRetriedAfterCommit(t, done, 9003)
}

// A role that may not set deadlock_timeout keeps the server's, and its
// migration's transaction goes on (the refusal is taken back to a
// savepoint); a superuser's gets migrationDeadlockTimeout.
func TestShortDeadlockTimeoutIsBestEffort(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	plain, _, _ := db.Login(t, "")
	var server string
	require.NoError(t, plain.QueryRow(ctx, `SELECT current_setting('deadlock_timeout')`).Scan(&server))
	for _, c := range []struct {
		name string
		pool *pgxpool.Pool
		want string
	}{{"superuser", db.Pool, "100ms"}, {"a login without the grant", plain, server}} {
		t.Run(c.name, func(t *testing.T) {
			tx, err := c.pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck // read only
			require.NoError(t, schema.ShortDeadlockTimeout(ctx, tx))
			var got string
			require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('deadlock_timeout')`).Scan(&got),
				"the transaction goes on")
			require.Equal(t, c.want, got)
		})
	}
}
