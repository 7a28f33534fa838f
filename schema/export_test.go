package schema

// BackfillState exposes the backfill that Migrate runs before migration 0033
// to state_mirror_test.go (package schema_test: it needs internal/testenv,
// which imports this package).
var BackfillState = backfillState

// BackfillStatement is backfill.sql's BackfillState, which copies one batch.
var BackfillStatement = backfillQueries.Get("BackfillState")

// RetryMigration exposes the retry decision of a failed migration to
// migrate_retry_test.go.
var RetryMigration = retryMigration
