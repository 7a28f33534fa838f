package main

import (
	_ "embed"

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
// after-rollout ones included (nudgectl migrate --after-rollout): migration
// 32's mirror dropped, so no statement of the harness relies on it, and
// schema 44's lazy intake on (a horizon of 2 hours: a reminder due that far
// ahead gets its state row from the promoter, in due order) with
// reminder_state's foreign key dropped.
var migrate = schema.MigrateAfterRollout
