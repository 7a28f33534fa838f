package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/pkg/reminder"
)

// UnknownAttempt is an attempt whose outcome is unknown: no answer came, or
// its worker died mid-send. The provider may hold its message.
type UnknownAttempt struct {
	ReminderID int64
	AttemptID  int64
	// ProviderID is the provider's message id, when one was recorded.
	ProviderID string
	StartedAt  time.Time
	// Provider is the provider its request went to (schema version 24),
	// "" when not recorded: any of the channel's providers may hold it.
	Provider string
}

// UnknownAttempts returns, by reminder id, the attempts of the given
// reminders whose outcome is unknown, oldest first, leaving out the attempt
// ids in except (the attempts in hand).
func (s *Store) UnknownAttempts(ctx context.Context, ids, except []int64) (map[int64][]UnknownAttempt, error) {
	if except == nil {
		except = []int64{}
	}
	rows, err := s.pool.Query(ctx, query("UnknownAttempts"), pgx.NamedArgs{"ids": ids, "except": except})
	if err != nil {
		return nil, fmt.Errorf("reading attempts of unknown outcome: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (UnknownAttempt, error) {
		var a UnknownAttempt
		err := r.Scan(&a.ReminderID, &a.AttemptID, &a.ProviderID, &a.StartedAt, &a.Provider)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading attempts of unknown outcome: %w", err)
	}
	out := make(map[int64][]UnknownAttempt)
	for _, a := range list {
		out[a.ReminderID] = append(out[a.ReminderID], a)
	}
	return out, nil
}

// FoundAtProvider records reminders delivered without a send: each waits
// (leased, enqueued or retrying) at its fence, and the provider was found to
// hold the message of an earlier attempt whose outcome was unknown. The
// worker does this where the reminder would otherwise expire.
func (s *Store) FoundAtProvider(ctx context.Context, now time.Time, fs []Fenced, actor, reason string) (map[int64]bool, error) {
	return s.settle(ctx, "recording reminders found at the provider", now, fs, reminder.CodeFoundAtProvider, actor, reason)
}

// AttemptProvider records that attempt id's request goes to provider, before
// it leaves, when that is not the provider its claim recorded (failover sent
// it elsewhere), so a lookup after a crash asks the right one.
func (s *Store) AttemptProvider(ctx context.Context, id int64, provider string) error {
	if _, err := s.pool.Exec(ctx, query("AttemptProvider"), pgx.NamedArgs{"id": id, "provider": provider}); err != nil {
		return fmt.Errorf("recording attempt %d's provider %s: %w", id, provider, err)
	}
	return nil
}
