package config_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/testenv"
)

// Issue 13, finding 7: no statement_timeout or lock_timeout, so a statement
// blocked on a lock waited as long as the holder liked. A pool built with
// DBTimeouts fails it with lock_timeout within the bound, whatever role it
// logs in as (a superuser here); a timeout given in the URL wins.
func TestPoolTimeoutsBoundALockWait(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE lock_probe (id int PRIMARY KEY); INSERT INTO lock_probe VALUES (1)`)
	require.NoError(t, err)
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck // released at the end
	_, err = holder.Exec(ctx, `SELECT id FROM lock_probe FOR UPDATE`)
	require.NoError(t, err)

	c := config.Common{DatabaseURL: db.URL}
	pool, err := c.PoolWith(ctx, config.DBTimeouts{Statement: 5 * time.Second, Lock: 300 * time.Millisecond,
		IdleInTransaction: time.Minute})
	require.NoError(t, err)
	defer pool.Close()
	var stmt, idle string
	require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('statement_timeout'),
		current_setting('idle_in_transaction_session_timeout')`).Scan(&stmt, &idle))
	require.Equal(t, [2]string{"5s", "1min"}, [2]string{stmt, idle})

	start := time.Now()
	_, err = pool.Exec(ctx, `UPDATE lock_probe SET id = 2`)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "got %v", err)
	require.Equal(t, "55P03", pgErr.Code, "lock_not_available: %s", pgErr.Message)
	require.Less(t, time.Since(start), 3*time.Second, "within the bound, not as long as the holder likes")

	c.DatabaseURL = db.URL + "&lock_timeout=1234"
	pool2, err := c.PoolWith(ctx, config.DBTimeouts{Lock: 300 * time.Millisecond})
	require.NoError(t, err)
	defer pool2.Close()
	var lock string
	require.NoError(t, pool2.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&lock))
	require.Equal(t, "1234ms", lock, "the URL's own setting wins")
}
