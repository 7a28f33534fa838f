package campaign

import (
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	base := Snapshot{State: Planning, Deadline: now.Add(time.Hour), Lease: 30 * time.Second,
		Fence: 5, Continued: 5, UpdatedAt: now.Add(-time.Second), Enabled: true}
	with := func(f func(*Snapshot)) Snapshot { s := base; f(&s); return s }
	tests := []struct {
		name     string
		c        Snapshot
		cmd      int64
		timeLeft time.Duration
		want     Verdict
	}{
		{"the command of the current fence plans a slice", base, 5, -1, PlanSlice},
		{"with time for a lease left", base, 5, 31 * time.Second, PlanSlice},
		{"a duplicate of a planned command is dropped", base, 4, -1, Drop},
		{"an old replay is dropped", base, 1, -1, Drop},
		{"a command ahead of the campaign is dropped", base, 6, -1, Drop},
		{"a paused campaign plans nothing", with(func(s *Snapshot) { s.State = Paused }), 5, -1, Drop},
		{"a canceled one neither", with(func(s *Snapshot) { s.State = Canceled }), 5, -1, Drop},
		{"nor a done one", with(func(s *Snapshot) { s.State = Done }), 5, -1, Drop},
		{"nor a late one, even past its deadline", with(func(s *Snapshot) { s.State = Late; s.Deadline = now }), 5, -1, Drop},
		{"at the deadline the campaign ends late", with(func(s *Snapshot) { s.Deadline = now }), 5, -1, EndLate},
		{"past it too", with(func(s *Snapshot) { s.Deadline = now.Add(-time.Minute) }), 5, -1, EndLate},
		{"a deadline nearer than a lease ends it late: no slice starts that could commit after it",
			with(func(s *Snapshot) { s.Deadline = now.Add(29 * time.Second) }), 5, -1, EndLate},
		{"a deadline exactly a lease away still lets a slice start",
			with(func(s *Snapshot) { s.Deadline = now.Add(30 * time.Second) }), 5, -1, PlanSlice},
		{"a tenant outside the cohort waits", with(func(s *Snapshot) { s.Enabled = false }), 5, -1, Drop},
		{"a stopping planner defers", base, 5, 29 * time.Second, Defer},
		{"a stopped one too", base, 5, 0, Defer},
		{"a lost continuation is republished after a lease",
			with(func(s *Snapshot) { s.Continued = 4; s.UpdatedAt = now.Add(-30 * time.Second) }), 4, -1, Republish},
		{"but not within the lease: its planner may still publish it",
			with(func(s *Snapshot) { s.Continued = 4; s.UpdatedAt = now.Add(-29 * time.Second) }), 4, -1, Drop},
		{"the current command plans even when its own publish was not recorded",
			with(func(s *Snapshot) { s.Continued = 4; s.UpdatedAt = now.Add(-time.Hour) }), 5, -1, PlanSlice},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Decide(tt.c, tt.cmd, now, tt.timeLeft)
			if got.Verdict != tt.want {
				t.Errorf("Decide() = %v (%s), want %v", got.Verdict, got.Reason, tt.want)
			}
			if got.Reason == "" {
				t.Error("Decide() gave no reason")
			}
		})
	}
}
