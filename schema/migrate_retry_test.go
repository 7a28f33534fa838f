package schema_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/schema"
)

// A migration aborted as a deadlock's victim changed nothing and is run
// again at once, a bounded number of times; a lock timeout is retried on its
// own terms (LockPause); every other failure stops the run.
func TestRetryDeadlockOnlyADeadlocksVictim(t *testing.T) {
	t.Parallel()
	wrapped := func(code string) error {
		return fmt.Errorf("migration 0036_operator_statements: %w", &pgconn.PgError{Code: code, Message: "x"})
	}
	for _, tc := range []struct {
		name      string
		err       error
		deadlocks int
		want      bool
	}{
		{"deadlock, first", wrapped("40P01"), 1, true},
		{"deadlock, fourth", wrapped("40P01"), 4, true},
		{"deadlock, fifth: give up", wrapped("40P01"), 5, false},
		{"serialization failure", wrapped("40001"), 1, false},
		{"lock timeout: not a deadlock", wrapped("55P03"), 1, false},
		{"syntax error", wrapped("42601"), 1, false},
		{"not from PostgreSQL", errors.New("connection reset"), 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, schema.RetryDeadlock(tc.err, tc.deadlocks))
		})
	}
}

// After a lock timeout the migration pauses 0.5 s, doubling up to 8 s, and
// is tried a last time when the budget (--lock-wait) runs out; past it, it
// gives up.
func TestLockPauseBacksOffWithinTheBudget(t *testing.T) {
	t.Parallel()
	const s = time.Second
	for _, tc := range []struct {
		timeouts     int
		waited, wait time.Duration
		want         time.Duration
		wantRetry    bool
	}{
		{1, 2 * s, 5 * time.Minute, 500 * time.Millisecond, true},
		{2, 5 * s, 5 * time.Minute, s, true},
		{3, 8 * s, 5 * time.Minute, 2 * s, true},
		{5, 20 * s, 5 * time.Minute, 8 * s, true},
		{40, 4 * time.Minute, 5 * time.Minute, 8 * s, true},
		{60, 5*time.Minute - 3*s, 5 * time.Minute, 3 * s, true},
		{61, 5 * time.Minute, 5 * time.Minute, 0, false},
		{1, 3 * s, 2 * s, 0, false},
	} {
		got, retry := schema.LockPause(tc.timeouts, tc.waited, tc.wait)
		require.Equal(t, tc.wantRetry, retry, "timeout %d after %s of %s", tc.timeouts, tc.waited, tc.wait)
		require.Equal(t, tc.want, got, "timeout %d after %s of %s", tc.timeouts, tc.waited, tc.wait)
	}
}
