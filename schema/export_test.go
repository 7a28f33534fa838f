package schema

// BackfillState exposes the backfill that Migrate runs before migration 0033
// to state_mirror_test.go (package schema_test: it needs internal/testenv,
// which imports this package).
var BackfillState = backfillState

// BackfillStatement is queries.sql's BackfillState, which copies one batch.
var BackfillStatement = queries.Get("BackfillState")

// RetryDeadlock and LockPause expose the retry decisions of a failed
// migration to migrate_retry_test.go.
var (
	RetryDeadlock = retryDeadlock
	LockPause     = lockPause
)

// WithMigrations is o applying migs instead of the embedded migrations, for
// the tests of lock timeouts and deadlocks (migrate_locks_test.go).
func WithMigrations(o Options, migs []Migration) Options {
	o.migrations = migs
	return o
}

// ShortDeadlockTimeout exposes what a migration's transaction sets first to
// migrate_locks_test.go.
var ShortDeadlockTimeout = shortDeadlockTimeout
