package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/message"
)

// EnvelopeLimit is the most reminders a dispatcher may put in one envelope
// (message.Batch): nudge_envelope_limit's max_entries, which the after-rollout
// migration 49 sets to message.MaxBatchEntries once no worker of the previous
// release runs, or message.PreviousMaxBatchEntries (what the previous
// release's workers accept) while the table does not exist or holds no row.
// The value is the operator's: the caller bounds it (dispatch caps it at
// message.MaxBatchEntries).
func (s *Store) EnvelopeLimit(ctx context.Context) (int, error) {
	var exists bool
	if err := s.pool.QueryRow(ctx, query("EnvelopeLimitExists")).Scan(&exists); err != nil {
		return 0, fmt.Errorf("looking for the envelope limit: %w", err)
	}
	if !exists {
		return message.PreviousMaxBatchEntries, nil
	}
	var n int
	err := s.pool.QueryRow(ctx, query("EnvelopeLimit")).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return message.PreviousMaxBatchEntries, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the envelope limit: %w", err)
	}
	return n, nil
}
