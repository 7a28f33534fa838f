// Package schema holds Nudge's versioned PostgreSQL migrations, embedded in
// every binary, and applies them. Migrate is idempotent and safe while the
// fleet runs: an advisory lock serialises concurrent runs, each migration
// applies in its own transaction together with its version row, and a version
// already recorded is never applied again.
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/nudgehq/nudge/internal/pg"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one versioned schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// advisoryLockKey is an arbitrary constant shared by every Migrate call
// ("nudge" in ASCII), scoped to the current database.
const advisoryLockKey = 0x6e75646765

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("reading embedded migrations: %w", err)
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration file %q: name must be NNNN_description.sql", name)
		}
		body, err := migrationFiles.ReadFile("migrations/" + name)
		if err != nil {
			return nil, fmt.Errorf("reading migration %q: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: rest, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("two migrations with version %d", out[i].Version)
		}
	}
	return out, nil
}

// Migrate applies every embedded migration not yet recorded in the
// nudge_migrations table of the current search_path schema and returns the
// versions it applied (empty when already up to date).
func Migrate(ctx context.Context, db pg.Beginner) ([]int, error) {
	migs, err := Migrations()
	if err != nil {
		return nil, err
	}
	var applied []int
	for _, m := range migs {
		did, err := apply(ctx, db, m)
		if err != nil {
			return applied, err
		}
		if did {
			applied = append(applied, m.Version)
		}
	}
	return applied, nil
}

func apply(ctx context.Context, db pg.Beginner, m Migration) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("migration %04d: begin: %w", m.Version, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit

	// Held until commit: a second Migrate waits here, then sees the version.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(advisoryLockKey)); err != nil {
		return false, fmt.Errorf("migration %04d: taking the migration lock: %w", m.Version, err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS nudge_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return false, fmt.Errorf("migration %04d: creating nudge_migrations: %w", m.Version, err)
	}
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM nudge_migrations WHERE version = $1)`,
		m.Version).Scan(&exists); err != nil {
		return false, fmt.Errorf("migration %04d: reading applied versions: %w", m.Version, err)
	}
	if exists {
		return false, nil
	}
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return false, fmt.Errorf("migration %04d_%s: %w", m.Version, m.Name, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO nudge_migrations (version, name) VALUES ($1, $2)`,
		m.Version, m.Name); err != nil {
		return false, fmt.Errorf("migration %04d: recording version: %w", m.Version, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("migration %04d: commit: %w", m.Version, err)
	}
	return true, nil
}
