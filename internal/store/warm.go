package store

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// warmStatements are the worker's statements of every batch, parsed on
// each connection Warm opens (by name, for the error; query's argument is
// a literal, which the sqlfile usage test reads).
var warmStatements = []struct{ name, sql string }{
	{"ClaimForDelivery", query("ClaimForDelivery")},
	{"RecordOutcomes", query("RecordOutcomes")},
}

// warmTables plans a read of the tables the worker's statements write and
// read: planning opens each table and its indexes, which fills the
// backend's relation caches.
const warmTables = `SELECT 1 FROM reminder_state, reminders, delivery_attempts, reminder_events LIMIT 0`

// Warm opens up to n of the pool's connections at once (never more than
// its maximum, and only while one is free without waiting) and has each
// load what the worker's first batches would otherwise load while their
// messages wait: the backend's start, its catalog and relation caches (a
// plan over the worker's tables) and the parse of the two statements of
// every batch (the functions, operators and types they name). Nothing is
// executed, so no statement's plan choice is skewed by an empty batch, and
// nothing is left prepared under a name pgx's statement cache does not
// manage (it would not re-prepare it after a migration changed a result
// type). Each new connection's first statements cost the database ~70 ms
// of CPU; a cold worker's p99 enqueue→terminal at 4,600/s read 124–268 ms
// without this, 43–60 ms with it (docs/benchmarks.md). An error leaves the
// pool as it was: the worker runs as without it.
func (s *Store) Warm(ctx context.Context, n int) error {
	n = min(n, int(s.pool.Config().MaxConns))
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	// Held until all are open, so each is a connection of its own; but
	// never waited for: once the pool is at its maximum with none idle,
	// the others are in use (or held by another Warm on a shared pool,
	// each of which would wait for the others' forever), so the ones held
	// are warmed and handed back.
	for range n {
		if st := s.pool.Stat(); st.TotalConns() >= st.MaxConns() && st.IdleConns() == 0 {
			break
		}
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("warming the database pool: %w", err)
		}
		conns = append(conns, c)
	}
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { errs[i] = warmConn(ctx, c.Conn()) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("warming the database pool: %w", err)
	}
	return nil
}

// warmConn plans warmTables and parses warmStatements on conn, as the
// unnamed statement (their text after the named arguments' rewrite, which
// does not depend on the values).
func warmConn(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, warmTables); err != nil {
		return err
	}
	for _, st := range warmStatements {
		sql, _, err := pgx.NamedArgs{}.RewriteQuery(ctx, conn, st.sql, nil)
		if err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		if _, err := conn.Prepare(ctx, "", sql); err != nil {
			return fmt.Errorf("parsing %s: %w", st.name, err)
		}
	}
	return nil
}
