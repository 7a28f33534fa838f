package ops_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ops"
)

// Each runbook answer is judged by its objective; intake never fails (a
// quiet hour is normal).
func TestVerdict(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	at := func(ago time.Duration) *time.Time { t := now.Add(-ago); return &t }
	healthy := func() *ops.Stats {
		return &ops.Stats{Now: now, NewestCreated: at(time.Hour),
			Dispatch: ops.DispatchStats{Cutoff: at(time.Minute), Source: "dispatch_runs"},
			Recent:   map[string]map[string]int64{"email": {"delivered": 3}}}
	}
	for _, tc := range []struct {
		name string
		edit func(s *ops.Stats)
		obj  ops.Objectives
		bad  []string // checks answered BAD
	}{
		{name: "healthy", edit: func(*ops.Stats) {}},
		{name: "no intake at all is not bad", edit: func(s *ops.Stats) { s.NewestCreated = nil }},
		{name: "no dispatcher run", edit: func(s *ops.Stats) { s.Dispatch = ops.DispatchStats{} }, bad: []string{"dispatcher runs"}},
		{name: "cutoff lag over", edit: func(s *ops.Stats) { s.Dispatch.Cutoff = at(6 * time.Minute) }, bad: []string{"cutoff lag"}},
		{name: "cutoff lag within a wider objective", edit: func(s *ops.Stats) { s.Dispatch.Cutoff = at(6 * time.Minute) },
			obj: ops.Objectives{CutoffLag: 10 * time.Minute}},
		{name: "oldest due over", edit: func(s *ops.Stats) { s.OldestDue = at(5*time.Minute + time.Second) },
			bad: []string{"oldest due, pending"}},
		{name: "oldest due at objective", edit: func(s *ops.Stats) { s.OldestDue = at(5 * time.Minute) }},
		{name: "queue not draining, workers idle", edit: func(s *ops.Stats) {
			s.OldestEnqueued, s.Recent = at(11*time.Minute), nil
		}, bad: []string{"oldest enqueued", "terminal outcomes"}},
		{name: "nothing ended, nothing waiting long", edit: func(s *ops.Stats) {
			s.OldestEnqueued, s.Recent = at(time.Minute), nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := healthy()
			tc.edit(s)
			answers := s.Verdict(tc.obj)
			var bad []string
			for _, a := range answers {
				if !a.OK {
					bad = append(bad, a.Check)
				}
			}
			require.Equal(t, tc.bad, bad, "%+v", answers)
			require.Equal(t, len(tc.bad) == 0, ops.Healthy(answers))
			require.Equal(t, ops.QuestionIntake, answers[0].Question, "in the runbook's order")
			require.Equal(t, ops.QuestionWorkers, answers[len(answers)-1].Question)
		})
	}
}
