package campaign

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgehq/nudge/internal/metrics"
)

// Outcome classifies what Decide and the effects return: its duplicates are
// the commands whose fence is not the campaign's, read from Decide's own
// reasons (so a change of wording there fails here).
func TestOutcome(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	base := Snapshot{State: Planning, Deadline: now.Add(time.Hour), Lease: 30 * time.Second,
		Fence: 5, Continued: 5, UpdatedAt: now.Add(-time.Second), Enabled: true}
	paused := base
	paused.State = Paused
	late := base
	late.Deadline = now
	lost := base
	lost.Continued, lost.UpdatedAt = 4, now.Add(-time.Minute)
	timeout := fmt.Errorf("reading slice 3 of campaign 1: %w", &pgconn.PgError{Code: "57014"})
	idle := fmt.Errorf("committing slice 3 of campaign 1: %w", &pgconn.PgError{Code: "25P03"})
	tests := []struct {
		name          string
		d             Decision
		err           error
		outcome, kind string
	}{
		{"a slice planned", Decide(base, 5, now, -1), nil, metrics.SlicePlanned, ""},
		{"a stale duplicate", Decide(base, 4, now, -1), nil, metrics.SliceDuplicate, metrics.PlanDupStale},
		{"an old replay", Decide(base, 1, now, -1), nil, metrics.SliceDuplicate, metrics.PlanDupStale},
		{"a command ahead", Decide(base, 6, now, -1), nil, metrics.SliceDuplicate, metrics.PlanDupAhead},
		{"a paused campaign", Decide(paused, 5, now, -1), nil, metrics.SliceInactive, ""},
		{"no such campaign", Decision{Drop, "no such campaign"}, nil, metrics.SliceInactive, ""},
		{"the deadline passed", Decide(late, 5, now, -1), nil, metrics.SliceLate, ""},
		{"a lost continuation", Decide(lost, 4, now, -1), nil, metrics.SliceRepublished, ""},
		{"a stopping planner", Decide(base, 5, now, time.Second), fmt.Errorf("%w: stopping", ErrDeferred), metrics.SliceDeferred, ""},
		{"an unverifiable command", Decision{}, fmt.Errorf("%w: bad signature", ErrPoison), metrics.SlicePoison, ""},
		{"a slice past its lease", Decide(base, 5, now, -1), timeout, metrics.SliceLeaseExpired, ""},
		{"idle past its lease", Decide(base, 5, now, -1), idle, metrics.SliceLeaseExpired, ""},
		{"any other error", Decide(base, 5, now, -1), errors.New("connection reset"), metrics.SliceFailed, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outcome, kind := Outcome(tt.d, tt.err)
			if outcome != tt.outcome || kind != tt.kind {
				t.Errorf("Outcome(%v %q, %v) = %q, %q; want %q, %q", tt.d.Verdict, tt.d.Reason, tt.err, outcome, kind, tt.outcome, tt.kind)
			}
		})
	}
}
