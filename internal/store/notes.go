package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/pkg/reminder"
)

// NoteEvents appends a note (code, one of reminder.Notes) to the timeline of
// each existing reminder of ids, reasons[i] for ids[i]: an event that says
// what happened to its message without moving it. It returns how many
// reminders exist to note.
func (s *Store) NoteEvents(ctx context.Context, now time.Time, code reminder.Code, ids []int64, reasons []string, actor string) (int64, error) {
	if !reminder.IsNote(code) {
		return 0, fmt.Errorf("noting events: %q is not a note code", code)
	}
	if len(ids) != len(reasons) {
		return 0, fmt.Errorf("noting events: %d reasons for %d reminders", len(reasons), len(ids))
	}
	tag, err := s.pool.Exec(ctx, query("NoteEvents"), pgx.NamedArgs{
		"now": now, "code": string(code), "ids": ids, "reasons": reasons, "actor": actor,
	})
	if err != nil {
		return 0, fmt.Errorf("noting %s events: %w", code, err)
	}
	return tag.RowsAffected(), nil
}
