package schema_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/schema"
)

// A migration aborted as a deadlock's victim changed nothing and is run
// again, a bounded number of times; every other failure stops the run.
func TestRetryMigrationOnlyADeadlocksVictim(t *testing.T) {
	t.Parallel()
	wrapped := func(code string) error {
		return fmt.Errorf("migration 0036_operator_statements: %w", &pgconn.PgError{Code: code, Message: "x"})
	}
	for _, tc := range []struct {
		name    string
		err     error
		attempt int
		want    bool
	}{
		{"deadlock, first attempt", wrapped("40P01"), 1, true},
		{"deadlock, fourth attempt", wrapped("40P01"), 4, true},
		{"deadlock, fifth attempt: give up", wrapped("40P01"), 5, false},
		{"serialization failure", wrapped("40001"), 1, false},
		{"lock timeout", wrapped("55P03"), 1, false},
		{"syntax error", wrapped("42601"), 1, false},
		{"not from PostgreSQL", errors.New("connection reset"), 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, schema.RetryMigration(tc.err, tc.attempt))
		})
	}
}
