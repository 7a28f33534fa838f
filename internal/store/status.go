package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// MessageStatus records the delivery status a provider reported for message
// sid (its rank orders statuses: a report ranked at or below the recorded
// one changes nothing), with its error code (0: none). It reports whether
// the status was recorded.
func (s *Store) MessageStatus(ctx context.Context, now time.Time, sid, status string, rank, errorCode int) (bool, error) {
	var code *int
	if errorCode != 0 {
		code = &errorCode
	}
	tag, err := s.pool.Exec(ctx, query("MessageStatus"), pgx.NamedArgs{"sid": sid, "status": status, "rank": rank,
		"error_code": code, "now": now})
	if err != nil {
		return false, fmt.Errorf("recording message %s's status %s: %w", sid, status, err)
	}
	return tag.RowsAffected() == 1, nil
}
