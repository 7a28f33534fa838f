// Package ops holds what an operator does to a running Nudge at 03:00,
// behind nudgectl: read the dead-letter queues without disturbing them and
// decide about their messages (replay a quarantined reminder, expire it, drop
// a message that names none), replay a window of reminders back to work, and
// answer the health questions with numbers (Stats).
//
// Every decision is a batched, fenced SQL statement (queries.sql) that moves
// the rows and appends their events with the operator's name and reason in
// the same statement, as internal/store does for the fleet. A replay never
// publishes anything itself: it returns reminders to pending under a new
// fence, the dispatcher publishes them on its next run, and every message
// already in a queue for them is superseded. Messages leave a dead-letter
// queue only after the decision about them is committed.
package ops

import (
	_ "embed"
	"errors"

	"github.com/nudgehq/nudge/internal/sqlfile"
)

//go:embed queries.sql
var queriesSQL string

var queries = sqlfile.Parse("queries.sql", queriesSQL)

func query(name string) string { return queries.Get(name) }

// Errors for operator input, so the CLI can say what to fix.
var (
	// ErrNoReason: every decision must say why, for the audit trail.
	ErrNoReason = errors.New("--reason is required: say why, for the audit trail")
	// ErrNoActor: every decision names who took it.
	ErrNoActor = errors.New("--actor is required (it defaults to $USER, which is not set)")
	// ErrNoSelection: a dead-letter decision must say which messages.
	ErrNoSelection = errors.New("select dead letters: --id, --message, --dead-reason or --all")
)

// Event reasons start with the tool that made the decision, so the trail
// (and Stats, which does not count an operator's expiry as a deadline miss)
// can tell operator decisions from the fleet's.
const (
	ReasonPrefixReplay    = "replay: "
	ReasonPrefixDLQReplay = "dlq replay: "
	ReasonPrefixDLQExpire = "dlq expire: "
)
