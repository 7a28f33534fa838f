// Package pg names what Nudge's packages need from PostgreSQL, once: a
// Querier (a pool, a connection or a transaction) to run statements on, and a
// Beginner when a package must open its own transaction. Every package takes
// these rather than declaring its own near-identical interface, so a pgx
// type, a test's transaction and an application's connection fit all of them.
package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier runs statements. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Beginner is a Querier that can start a transaction: *pgxpool.Pool and
// *pgx.Conn (and pgx.Tx, as a savepoint).
type Beginner interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
}
