package intake_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// captured is a Querier that keeps the bulk statement and its arguments
// instead of running it.
type captured struct {
	pg.Querier
	sql  string
	args []any
}

var errCaptured = errors.New("captured, not run")

func (c *captured) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.sql, c.args = sql, args
	return nil, errCaptured
}

func (c *captured) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errCaptured
}

// Regression (issue 18): the bulk statement called nudge_invalid through
// the SQL function executor for every row, an executor start per row (half
// of the statement's CPU: 0.060 against 0.032 CPU-s per 1,000 reminders).
// The function is inlined only when an argument it reads more than once is
// cheap, and the due time and deadline it was given were the CASE that
// resolves a local wall time (nudge_resolve_local, a function call), pulled
// up from the CTE that computes them. With that CTE materialized they are
// plain columns and the check is inlined. Both plans are checked: the first
// five executions of a prepared statement are planned with their values,
// the later ones generically.
func TestBulkIntakeInlinesValidation(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	due := time.Now().Add(time.Hour)
	q := &captured{}
	_, err := intake.ScheduleMany(ctx, q, []intake.Request{
		{Tenant: "acme", Key: "k1", Channel: reminder.SMS, Recipient: "+14155550100", Template: "course-expiry",
			DueAt: due, Deadline: due.Add(time.Hour)},
		{Tenant: "acme", Key: "k2", Channel: reminder.Email, Recipient: "a@example.com", Template: "course-expiry",
			TZ: "Europe/Stockholm", DueLocal: "2030-01-02T09:00", DeadlineLocal: "2030-01-02T18:00"},
	})
	require.ErrorIs(t, err, errCaptured)
	require.NotEmpty(t, q.sql)

	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		t.Run(mode, func(t *testing.T) {
			conn, err := db.Pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			_, err = conn.Exec(ctx, "SET plan_cache_mode = "+mode)
			require.NoError(t, err)
			defer conn.Exec(ctx, "RESET plan_cache_mode") //nolint:errcheck // the pool's next user
			rows, err := conn.Query(ctx, "EXPLAIN (VERBOSE, COSTS OFF) "+q.sql, q.args...)
			require.NoError(t, err)
			var plan strings.Builder
			for rows.Next() {
				var line string
				require.NoError(t, rows.Scan(&line))
				plan.WriteString(line + "\n")
			}
			require.NoError(t, rows.Err())
			require.True(t, strings.Contains(plan.String(), "must be an E.164 phone number"),
				"the check's body is not in the plan")
			require.Zero(t, strings.Count(plan.String(), "nudge_invalid("),
				"the plan calls nudge_invalid per row instead of inlining it")
		})
	}
}
