package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file holds the channel's shared provider choice (provider_failover,
// schema version 19): which of its providers the whole fleet sends through,
// the counts the failover decision reads and the probe of the first
// provider. Each call is one conditional statement; the decision itself is
// the caller's (internal/sms, Failover).

// FailoverCounts are the current provider's counts after a report.
type FailoverCounts struct {
	// Failures is the number of consecutive retryable failures.
	Failures int
	// Sends and Failed count sends and retryable failures in the window.
	Sends, Failed int
}

// FailoverCurrent returns the channel's provider in use and when its next
// probe of the first provider is due (zero when none is: it is on first),
// starting the channel on first when it has no row yet.
func (s *Store) FailoverCurrent(ctx context.Context, channel, first string, now time.Time) (current string, probeAt time.Time, err error) {
	var at *time.Time
	args := pgx.NamedArgs{"channel": channel, "first": first, "now": now}
	err = s.pool.QueryRow(ctx, query("FailoverCurrent"), args).Scan(&current, &at)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another worker created the row after this statement's snapshot
		// was taken (its insert waited for that one): read it again.
		err = s.pool.QueryRow(ctx, query("FailoverCurrent"), args).Scan(&current, &at)
	}
	if err != nil {
		return "", time.Time{}, fmt.Errorf("reading the %s provider in use: %w", channel, err)
	}
	if at != nil {
		probeAt = *at
	}
	return current, probeAt, nil
}

// FailoverCount counts send results against provider, if it is still the
// channel's current one: successes successful sends, then (failed) one
// retryable failure; it returns the counts; ok is false when the channel
// has moved on (nothing counted). A window that ended before now restarts
// with these sends.
func (s *Store) FailoverCount(ctx context.Context, channel, provider string, successes int, failed bool, now time.Time, window time.Duration) (c FailoverCounts, ok bool, err error) {
	err = s.pool.QueryRow(ctx, query("FailoverCount"), pgx.NamedArgs{
		"channel": channel, "provider": provider, "successes": successes, "failed": failed, "now": now, "window": window,
	}).Scan(&c.Failures, &c.Sends, &c.Failed)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("counting a send at the %s provider %s: %w", channel, provider, err)
	}
	return c, true, nil
}

// FailoverSwitch moves the channel from provider from to provider to, with
// fresh counts and the next probe of the first provider at probeAt (zero:
// none). False means the channel was no longer on from: someone else
// switched first, and nothing changed.
func (s *Store) FailoverSwitch(ctx context.Context, channel, from, to string, now, probeAt time.Time) (bool, error) {
	var at *time.Time
	if !probeAt.IsZero() {
		at = &probeAt
	}
	tag, err := s.pool.Exec(ctx, query("FailoverSwitch"), pgx.NamedArgs{
		"channel": channel, "from": from, "to": to, "now": now, "probe_at": at,
	})
	if err != nil {
		return false, fmt.Errorf("moving the %s channel from provider %s to %s: %w", channel, from, to, err)
	}
	return tag.RowsAffected() == 1, nil
}

// FailoverClaimProbe takes the channel's probe of its first provider when
// it is due (the channel is on another one and its probe time has come),
// setting the next one to next. True: this caller, alone in the fleet, may
// try the first provider now.
func (s *Store) FailoverClaimProbe(ctx context.Context, channel, first string, now, next time.Time) (bool, error) {
	tag, err := s.pool.Exec(ctx, query("FailoverClaimProbe"), pgx.NamedArgs{
		"channel": channel, "first": first, "now": now, "next": next,
	})
	if err != nil {
		return false, fmt.Errorf("claiming the %s channel's probe of provider %s: %w", channel, first, err)
	}
	return tag.RowsAffected() == 1, nil
}
