package ops

import (
	"fmt"
	"time"
)

// Objectives are the thresholds the runbook's answers are judged by
// (nudgectl stats --max-*). Each zero value is the default the shipped
// alerts use.
type Objectives struct {
	// OldestDue bounds how long the oldest due, pending reminder may wait
	// for the dispatcher. Zero value: 5 minutes (NudgeOldestDueReminderTooOld).
	OldestDue time.Duration
	// CutoffLag bounds how far the dispatcher's cutoff may trail now. Zero
	// value: 5 minutes.
	CutoffLag time.Duration
	// OldestEnqueued bounds how long a published reminder may wait for a
	// worker. Zero value: 10 minutes (the reconciler's default --overdue,
	// after which it presumes the message lost).
	OldestEnqueued time.Duration
}

// WithDefaults returns o with each zero (or negative) field set to its default.
func (o Objectives) WithDefaults() Objectives {
	if o.OldestDue <= 0 {
		o.OldestDue = 5 * time.Minute
	}
	if o.CutoffLag <= 0 {
		o.CutoffLag = 5 * time.Minute
	}
	if o.OldestEnqueued <= 0 {
		o.OldestEnqueued = 10 * time.Minute
	}
	return o
}

// The runbook's questions, in its order.
const (
	QuestionIntake   = "is intent still being written?"
	QuestionDispatch = "is the dispatcher advancing its cutoff?"
	QuestionQueue    = "is the queue draining within objective?"
	QuestionWorkers  = "are workers producing terminal records?"
)

// Answer is one check of a runbook question.
type Answer struct {
	Question string `json:"question"`
	// Check names what was measured; Value says what it is.
	Check string `json:"check"`
	Value string `json:"value"`
	// OK is false when the answer is bad: something to act on.
	OK bool `json:"ok"`
}

// Verdict answers the runbook's questions from s, in order, judged by o.
// Intake has no objective (a quiet hour is normal) and is always OK; the
// dispatcher's answers are bad when no run is known, or its cutoff lag or
// the oldest due reminder's wait is over objective; the queue's when the
// oldest enqueued reminder waited over objective; the workers' when work
// has waited longer than RecentWindow and nothing ended in it.
func (s *Stats) Verdict(o Objectives) []Answer {
	o = o.WithDefaults()
	ago := func(d time.Duration) string { return d.Round(time.Second).String() + " ago" }
	within := func(d, obj time.Duration) string {
		return fmt.Sprintf("%s (objective %s)", d.Round(time.Second), obj)
	}
	var out []Answer
	add := func(q, check, value string, ok bool) { out = append(out, Answer{q, check, value, ok}) }

	if s.NewestCreated == nil {
		add(QuestionIntake, "newest reminder scheduled", "none yet", true)
	} else {
		add(QuestionIntake, "newest reminder scheduled", ago(s.Age(s.NewestCreated)), true)
	}

	switch {
	case s.Dispatch.Cutoff == nil:
		add(QuestionDispatch, "dispatcher runs", "no dispatcher run recorded in the last day and no claim event: is it running?", false)
	default:
		lag := s.CutoffLag()
		add(QuestionDispatch, "cutoff lag", within(lag, o.CutoffLag)+" from "+s.Dispatch.Source, lag <= o.CutoffLag)
	}
	due := s.OldestDueAge()
	add(QuestionDispatch, "oldest due, pending", within(due, o.OldestDue), due <= o.OldestDue)

	enq := s.Age(s.OldestEnqueued)
	add(QuestionQueue, "oldest enqueued", within(enq, o.OldestEnqueued), enq <= o.OldestEnqueued)

	var ended int64
	for _, byOutcome := range s.Recent {
		for _, n := range byOutcome {
			ended += n
		}
	}
	stuck := enq > RecentWindow
	value := fmt.Sprintf("%d terminal in the last %s", ended, RecentWindow)
	if ended == 0 && stuck {
		value += fmt.Sprintf(", while the oldest enqueued reminder waited %s", enq.Round(time.Second))
	}
	add(QuestionWorkers, "terminal outcomes", value, ended > 0 || !stuck)
	return out
}

// Healthy reports whether every answer is OK.
func Healthy(answers []Answer) bool {
	for _, a := range answers {
		if !a.OK {
			return false
		}
	}
	return true
}

// Report is Stats as nudgectl stats --json prints it: ages in seconds
// (null: nothing waiting, or unknown) instead of timestamps, so that a
// script compares numbers without a clock, and the verdict.
type Report struct {
	Now       time.Time                   `json:"now"`
	ByChannel map[string]map[string]int64 `json:"by_channel"`
	ByTenant  map[string]map[string]int64 `json:"by_tenant"`
	// EstimatedStates lists the states whose counts are estimates (Stats.Estimated; absent: all exact).
	EstimatedStates []string `json:"estimated_states,omitempty"`

	NewestCreatedAgeSeconds   *float64 `json:"newest_created_age_seconds"`
	OldestDueAgeSeconds       *float64 `json:"oldest_due_age_seconds"`
	OldestEnqueuedAgeSeconds  *float64 `json:"oldest_enqueued_age_seconds"`
	OldestRetryDueAgeSeconds  *float64 `json:"oldest_retry_due_age_seconds"`
	OldestUnexpiredAgeSeconds *float64 `json:"oldest_unexpired_age_seconds"`
	OldestDeadLeaseAgeSeconds *float64 `json:"oldest_dead_lease_age_seconds"`

	Dispatch DispatchReport `json:"dispatch"`

	DeadlineMisses map[string]Window `json:"deadline_misses"`
	Quarantined    map[string]Window `json:"quarantined"`
	DeadLetters    map[string]int    `json:"dead_letters,omitempty"`
	DeadLettersErr string            `json:"dead_letters_error,omitempty"`

	// Recent counts the terminal outcomes of the last RecentWindowSeconds.
	RecentWindowSeconds float64                     `json:"recent_window_seconds"`
	Recent              map[string]map[string]int64 `json:"recent"`

	Verdict []Answer `json:"verdict"`
	// Healthy: every answer of Verdict is OK (nudgectl exits 0).
	Healthy bool `json:"healthy"`
}

// DispatchReport is DispatchStats with ages.
type DispatchReport struct {
	CutoffLagSeconds  *float64 `json:"cutoff_lag_seconds"`
	LastRunAgeSeconds *float64 `json:"last_run_age_seconds"`
	RunsLastDay       int64    `json:"runs_last_day"`
	Source            string   `json:"source"`
	Note              string   `json:"note,omitempty"`
}

// Report returns s with ages, judged by o.
func (s *Stats) Report(o Objectives) Report {
	age := func(t *time.Time) *float64 {
		if t == nil {
			return nil
		}
		v := s.Now.Sub(*t).Seconds()
		return &v
	}
	verdict := s.Verdict(o)
	return Report{
		Now: s.Now, ByChannel: s.ByChannel, ByTenant: s.ByTenant, EstimatedStates: s.Estimated,
		NewestCreatedAgeSeconds: age(s.NewestCreated), OldestDueAgeSeconds: age(s.OldestDue),
		OldestEnqueuedAgeSeconds: age(s.OldestEnqueued), OldestRetryDueAgeSeconds: age(s.OldestRetryDue),
		OldestUnexpiredAgeSeconds: age(s.OldestUnexpired), OldestDeadLeaseAgeSeconds: age(s.OldestDeadLease),
		Dispatch: DispatchReport{CutoffLagSeconds: age(s.Dispatch.Cutoff), LastRunAgeSeconds: age(s.Dispatch.LastRun),
			RunsLastDay: s.Dispatch.RunsLastDay, Source: s.Dispatch.Source, Note: s.Dispatch.Note},
		DeadlineMisses: s.DeadlineMisses, Quarantined: s.Quarantined,
		DeadLetters: s.DeadLetters, DeadLettersErr: s.DeadLettersErr,
		RecentWindowSeconds: RecentWindow.Seconds(), Recent: s.Recent,
		Verdict: verdict, Healthy: Healthy(verdict),
	}
}
