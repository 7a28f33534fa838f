package metrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/testenv"
)

const oldestTx = "nudge_db_oldest_transaction_age_seconds"

// A session the oldest-transaction test opens: its backend's pid, the
// Querier to scrape on (nil: the test's pool) and how it ends its
// transaction (nil: it has none).
type txSession struct {
	pid      int
	scrapeOn pg.Querier
	end      func()
}

// nudge_db_oldest_transaction_age_seconds is the age of the oldest
// transaction a client holds open on the database, whatever it does in it
// (waits idle in it, holds a snapshot, has written, runs a statement), as
// the database's own clock tells it; an idle session, an aborted
// transaction and the scrape's own transaction are not counted, and an
// ended transaction no longer is. In a
// database of its own: on the shared test database every other test's
// transactions would be in the figure.
func TestDBCollectorOldestTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.PostgresOwnDatabase(t)
	ctx := context.Background()
	// The gauge ignores the collector's clock (xact_start is the database's):
	// a fake one far off proves it.
	clk := clock.NewFake(time.Now().Add(-24 * time.Hour))
	scrape := func(t *testing.T, on pg.Querier) float64 {
		t.Helper()
		reg := prometheus.NewRegistry()
		reg.MustRegister(metrics.NewDBCollector(on, clk))
		vs := values(t, reg)
		require.Equal(t, 1.0, vs["nudge_db_scrape_success"])
		require.Contains(t, vs, oldestTx)
		return vs[oldestTx]
	}
	// age is the database's figure for pid's transaction: 0 without one.
	age := func(t *testing.T, pid int) float64 {
		t.Helper()
		var s float64
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT coalesce(extract(epoch FROM statement_timestamp() - xact_start), 0)::float8
			FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&s))
		return s
	}
	connect := func(t *testing.T) (*pgx.Conn, int) {
		t.Helper()
		conn, err := pgx.Connect(ctx, db.URL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		var pid int
		require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		return conn, pid
	}
	// inTx opens a session whose transaction begins with begin and runs stmt.
	inTx := func(begin, stmt, end string) func(t *testing.T) txSession {
		return func(t *testing.T) txSession {
			conn, pid := connect(t)
			_, err := conn.Exec(ctx, begin)
			require.NoError(t, err)
			_, err = conn.Exec(ctx, stmt)
			require.NoError(t, err)
			return txSession{pid: pid, end: func() {
				_, err := conn.Exec(ctx, end)
				require.NoError(t, err)
			}}
		}
	}

	require.Zero(t, scrape(t, db.Pool), "nothing open")
	for _, tc := range []struct {
		name    string
		open    func(t *testing.T) txSession
		counted bool
	}{
		{name: "idle session", counted: false, open: func(t *testing.T) txSession {
			conn, pid := connect(t)
			_, err := conn.Exec(ctx, `SELECT 1`)
			require.NoError(t, err)
			return txSession{pid: pid}
		}},
		{name: "idle in transaction", counted: true, open: inTx(`BEGIN`, `SELECT 1`, `COMMIT`)},
		// An aborted transaction has released its snapshot and locks, and
		// PostgreSQL clears its xact_start: nothing is held.
		{name: "idle in an aborted transaction", counted: false, open: func(t *testing.T) txSession {
			conn, pid := connect(t)
			_, err := conn.Exec(ctx, `BEGIN`)
			require.NoError(t, err)
			_, err = conn.Exec(ctx, `SELECT 1/0`)
			require.Error(t, err)
			return txSession{pid: pid}
		}},
		{name: "holding a snapshot", counted: true,
			open: inTx(`BEGIN ISOLATION LEVEL REPEATABLE READ`, `SELECT count(*) FROM reminders`, `ROLLBACK`)},
		{name: "a writer", counted: true, open: inTx(`BEGIN`, `SELECT txid_current()`, `COMMIT`)},
		{name: "a running statement", counted: true, open: func(t *testing.T) txSession {
			conn, pid := connect(t)
			done := make(chan error, 1)
			go func() {
				_, err := conn.Exec(ctx, `SELECT pg_sleep(60)`)
				done <- err
			}()
			require.Eventually(t, func() bool {
				var n int
				require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE pid = $1 AND state = 'active' AND query LIKE '%pg_sleep%'`, pid).Scan(&n))
				return n == 1
			}, 10*time.Second, 10*time.Millisecond)
			return txSession{pid: pid, end: func() {
				// Canceled rather than waited for; the error comes after the
				// backend reported itself idle.
				_, err := db.Pool.Exec(ctx, `SELECT pg_cancel_backend($1)`, pid)
				require.NoError(t, err)
				var pgErr *pgconn.PgError
				require.True(t, errors.As(<-done, &pgErr) && pgErr.Code == "57014", "canceled")
			}}
		}},
		{name: "the scrape's own transaction", counted: false, open: func(t *testing.T) txSession {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			var pid int
			require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
			return txSession{pid: pid, scrapeOn: tx, end: func() { require.NoError(t, tx.Rollback(ctx)) }}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.open(t)
			on := s.scrapeOn
			if on == nil {
				on = db.Pool
			}
			before := age(t, s.pid)
			got := scrape(t, on)
			after := age(t, s.pid)
			if tc.counted {
				require.Positive(t, got)
				require.GreaterOrEqual(t, got, before, "at least the age the database gave just before")
				require.LessOrEqual(t, got, after, "at most the age it gave just after")
			} else {
				require.Zero(t, got)
				if s.end != nil {
					require.Positive(t, before, "it has a transaction, open for a while")
				}
			}
			if s.end != nil {
				s.end()
			}
			require.Zero(t, scrape(t, db.Pool), "ended: nothing open")
		})
	}
}

// Without pg_read_all_stats a login reads only its own sessions' activity,
// so the oldest-transaction gauge reads 0 whatever another login holds
// open: nudge_db_activity_readable says so (0), and reads 1 once the login
// is granted the role, when the same transaction is seen. As the
// reconciler runs it: a login of nudge_reconciler, the scrape otherwise
// whole (scrape success 1).
func TestDBCollectorSaysWhenItCannotReadOtherSessions(t *testing.T) {
	t.Parallel()
	db := testenv.PostgresOwnDatabase(t)
	ctx := context.Background()
	login, name, _ := db.Login(t, "nudge_reconciler")
	ident := pgx.Identifier{name}.Sanitize()

	scrape := func(t *testing.T, on pg.Querier) (age, readable float64) {
		t.Helper()
		reg := prometheus.NewRegistry()
		reg.MustRegister(metrics.NewDBCollector(on, clock.Real{}))
		vs := values(t, reg)
		require.Equal(t, 1.0, vs["nudge_db_scrape_success"])
		require.Contains(t, vs, oldestTx)
		require.Contains(t, vs, "nudge_db_activity_readable")
		return vs[oldestTx], vs["nudge_db_activity_readable"]
	}

	// Another login (the superuser) holds a writing transaction open.
	holder, err := pgx.Connect(ctx, db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	_, err = holder.Exec(ctx, `BEGIN`)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `SELECT txid_current()`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { age, _ := scrape(t, db.Pool); return age > 0 }, 5*time.Second, 10*time.Millisecond,
		"the superuser sees the open transaction")

	age, readable := scrape(t, login)
	require.Zero(t, readable, "the reconciler's login without pg_read_all_stats")
	require.Zero(t, age, "blind to the other login's transaction: why the gauge above exists")

	_, err = db.Pool.Exec(ctx, `GRANT pg_read_all_stats TO `+ident)
	require.NoError(t, err)
	age, readable = scrape(t, login)
	require.Equal(t, 1.0, readable, "granted pg_read_all_stats")
	require.Positive(t, age, "now the other login's transaction is seen")

	_, superReadable := scrape(t, db.Pool)
	require.Equal(t, 1.0, superReadable, "a superuser reads every session")
	_, err = holder.Exec(ctx, `COMMIT`)
	require.NoError(t, err)
}
