package main

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/schema"
)

// The harness's own statements live in queries.sql, as Nudge's live in
// internal/store/queries.sql, so each reads as SQL in one place.
//
//go:embed queries.sql
var queriesSQL string

var queries = sqlfile.Parse("queries.sql", queriesSQL)

// stmt returns the harness statement called name.
func stmt(name string) string { return queries.Get(name) }

// migrate migrates every schema the harness measures Nudge in, as
// production runs after the rollout: every migration applied, the
// after-rollout ones included (nudgectl migrate --after-rollout: migration
// 32's mirror dropped, so no statement of the harness relies on it), then
// lazy intake turned on (lazyIntakeOn).
func migrate(ctx context.Context, pool *pgxpool.Pool) ([]int, error) {
	applied, err := schema.MigrateAfterRollout(ctx, pool)
	if err != nil {
		return applied, err
	}
	return applied, lazyIntakeOn(ctx, pool)
}

// lazyIntakeOn does what schema 44, after the rollout, does in production:
// lazy intake on (a horizon of 2 hours: a reminder due that far ahead gets
// its state row from the promoter, in due order) and reminder_state's
// foreign key dropped. It runs after the migrations whether or not that
// migration is among them (both statements are idempotent), so what the
// bench measures does not depend on the order in which it is merged.
func lazyIntakeOn(ctx context.Context, pool *pgxpool.Pool) error {
	for _, name := range []string{"LazyIntakeOn", "DropStateKey"} {
		if _, err := pool.Exec(ctx, stmt(name)); err != nil {
			return fmt.Errorf("lazy intake on (%s): %w", name, err)
		}
	}
	return nil
}
