package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Warm opens n connections of the pool (never more than its maximum),
// leaves no statement prepared on them that pgx's cache does not manage,
// and the worker's statements run on them afterwards as before.
func TestWarmOpensTheConnections(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := poolOf(t, testenv.Postgres(t), 6)
	st := store.New(pool)
	require.Zero(t, pool.Stat().TotalConns(), "a new pool connects on first use")

	require.NoError(t, st.Warm(ctx, 5))
	require.EqualValues(t, 5, pool.Stat().TotalConns())
	require.EqualValues(t, 5, pool.Stat().IdleConns(), "all handed back")
	var held []*pgxpool.Conn
	for range 5 {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
		var prepared int
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE name NOT LIKE 'stmtcache_%'`).Scan(&prepared))
		require.Zero(t, prepared, "nothing left prepared outside pgx's statement cache")
	}
	require.EqualValues(t, 5, pool.Stat().TotalConns(), "the five were the warmed ones")
	for _, c := range held {
		c.Release()
	}

	// The worker's statements after a warm-up, on every connection.
	now := time.Now()
	for range 6 {
		out, att, err := st.ClaimForDelivery(ctx, now, reminder.SMS, "", nil, time.Minute, "w")
		require.NoError(t, err)
		require.Empty(t, out)
		require.Empty(t, att)
		moved, err := st.RecordOutcomes(ctx, now, nil, "w")
		require.NoError(t, err)
		require.Empty(t, moved)
	}

	require.NoError(t, st.Warm(ctx, 100))
	require.EqualValues(t, 6, pool.Stat().TotalConns(), "at most the pool's maximum")
}

// Workers that share a pool warm it at once without waiting for each
// other: each would otherwise hold some connections and wait for the rest
// (a deadlock the worker's 10 s bound would end, after its messages had
// waited). Each stops taking connections once the pool is full.
func TestWarmOnASharedPoolDoesNotWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := poolOf(t, testenv.Postgres(t), 4)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	errs := make([]error, 3)
	var wg sync.WaitGroup
	began := time.Now()
	for i := range errs {
		wg.Go(func() { errs[i] = store.New(pool).Warm(wctx, 5) })
	}
	wg.Wait()
	t.Logf("three warm-ups on a pool of 4 took %s", time.Since(began).Round(time.Millisecond))
	for _, err := range errs {
		require.NoError(t, err, "every warm-up ended on its own, before the test's bound")
	}
	require.LessOrEqual(t, pool.Stat().TotalConns(), int32(4))
	require.EqualValues(t, pool.Stat().TotalConns(), pool.Stat().IdleConns(), "all handed back")
}

// poolOf is a pool of its own on db's schema with at most maxConns connections,
// none opened yet.
func poolOf(t *testing.T, db *testenv.DB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}
