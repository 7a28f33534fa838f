package main

import (
	_ "embed"

	"github.com/nudgehq/nudge/internal/sqlfile"
)

// The harness's own statements live in queries.sql, as Nudge's live in
// internal/store/queries.sql, so each reads as SQL in one place.
//
//go:embed queries.sql
var queriesSQL string

var queries = sqlfile.Parse("queries.sql", queriesSQL)

// stmt returns the harness statement called name.
func stmt(name string) string { return queries.Get(name) }
