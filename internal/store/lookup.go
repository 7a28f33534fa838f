package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// This file is the reconciler's side of settling unknown outcomes at the
// provider (issue 16): a reminder whose deadline passes while one of its
// attempts has an unknown outcome (no answer came, or its worker died
// mid-send) may have reached the recipient. Instead of expiring it at once,
// the reconciler asks the attempt's provider, and records it delivered
// (settled_by_lookup) when the provider holds the message, expired only once
// the provider says it has nothing, or once Hold.For has passed without an
// answer.

// Hold is what ExpireOverdueHolding keeps back for a lookup: the reminders
// of Channels, at most For past their deadline, with an attempt whose
// outcome is unknown, except the Looked (the provider said it has nothing).
// The zero value holds nothing.
type Hold struct {
	Channels []reminder.Channel
	For      time.Duration
	Looked   []int64
}

func (h Hold) channels() []string {
	out := make([]string, 0, len(h.Channels))
	for _, c := range h.Channels {
		out = append(out, string(c))
	}
	return out
}

func nonNil(ids []int64) []int64 {
	if ids == nil {
		return []int64{}
	}
	return ids
}

// Overdue is a reminder held for a lookup: what asking its provider needs.
type Overdue struct {
	ID             int64
	Fence          int64
	State          reminder.State
	Channel        reminder.Channel
	Tenant         string
	Recipient      string
	IdempotencyKey string
	Deadline       time.Time
}

// UnknownAtDeadline returns up to limit reminders that ExpireOverdueHolding
// with hold keeps back (hold.Looked aside), oldest deadline first, leaving
// out the ids in skip.
func (s *Store) UnknownAtDeadline(ctx context.Context, now time.Time, hold Hold, limit int, skip []int64) ([]Overdue, error) {
	rows, err := s.pool.Query(ctx, query("UnknownAtDeadline"), pgx.NamedArgs{"now": now, "hold_for": hold.For,
		"channels": hold.channels(), "skip": nonNil(skip), "limit": limit})
	if err != nil {
		return nil, fmt.Errorf("reading reminders of unknown outcome at their deadline: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Overdue, error) {
		var o Overdue
		err := r.Scan(&o.ID, &o.Fence, &o.State, &o.Channel, &o.Tenant, &o.Recipient, &o.IdempotencyKey, &o.Deadline)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("reading reminders of unknown outcome at their deadline: %w", err)
	}
	return out, nil
}

// Settled is a reminder at its fence, with the reason to record.
type Settled struct {
	Fenced
	Reason string
}

// SettledByLookup records as delivered the reminders, at their fences,
// whose provider was found to hold an unknown attempt's message at or past
// the deadline, each with its reason. It returns the ids it moved.
func (s *Store) SettledByLookup(ctx context.Context, now time.Time, ss []Settled, actor string) (map[int64]bool, error) {
	ids, fences, reasons := make([]int64, len(ss)), make([]int64, len(ss)), make([]string, len(ss))
	for i, x := range byID(ss, func(x Settled) int64 { return x.ID }) {
		ids[i], fences[i], reasons[i] = x.ID, x.Fence, x.Reason
	}
	return s.ids(ctx, "recording reminders settled by lookup", "SettledByLookup", pgx.NamedArgs{
		"now": now, "ids": ids, "fences": fences, "reasons": reasons, "actor": actor,
	})
}

// Earlier is the attempts as a provider lookup takes them.
func Earlier(as []UnknownAttempt) []provider.Earlier {
	out := make([]provider.Earlier, len(as))
	for i, a := range as {
		out[i] = provider.Earlier{AttemptID: a.AttemptID, ProviderID: a.ProviderID, Started: a.StartedAt, Provider: a.Provider}
	}
	return out
}
