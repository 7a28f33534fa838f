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

// migrate migrates every schema the harness measures Nudge in. The bench
// measures the release as it runs after its rollout: migration 32's mirror
// dropped (nudgectl migrate --after-rollout), so no statement of the
// harness relies on it (queries.sql writes reminder_state itself).
var migrate = schema.MigrateAfterRollout
