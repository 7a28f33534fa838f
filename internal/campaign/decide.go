package campaign

import (
	"fmt"
	"time"
)

// State is a campaign's planning state (the campaigns.state column).
type State string

// The states of a campaign.
const (
	Planning State = "planning"
	Paused   State = "paused"
	Done     State = "done"
	Canceled State = "canceled"
	Late     State = "late"
)

// Verdict is what the planner does with one planning command.
type Verdict int

// The verdicts of Decide.
const (
	// PlanSlice: plan one slice from the cursor, then continue.
	PlanSlice Verdict = iota + 1
	// Republish: the command is stale, but the continuation of the slice
	// that moved the fence was not confirmed within a lease of its commit
	// (its planner died between commit and publish): publish it now, plan
	// nothing. Within the lease, the committing planner may still publish
	// it, and a republish then would start a second chain of commands.
	Republish
	// Drop: nothing to do (a duplicate or replayed command, or a campaign
	// paused, done or canceled); acknowledge and write nothing.
	Drop
	// EndLate: the business deadline passed, or is nearer than a lease (a
	// slice started now could commit after it), with audience left: end the
	// campaign late, counting what was not planned.
	EndLate
	// Defer: the planner has less time left than one lease (it is stopping):
	// give the command back without starting a slice.
	Defer
)

func (v Verdict) String() string {
	switch v {
	case PlanSlice:
		return "plan"
	case Republish:
		return "republish"
	case Drop:
		return "drop"
	case EndLate:
		return "late"
	case Defer:
		return "defer"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Snapshot is what Decide reads of a campaign, locked.
type Snapshot struct {
	State    State
	Deadline time.Time
	Lease    time.Duration
	// Fence counts the slices committed; Continued is the highest fence a
	// command was published (confirmed) for.
	Fence, Continued int64
	// UpdatedAt is when the last slice committed (or the state last changed).
	UpdatedAt time.Time
	// Enabled: the campaign's tenant is in the campaign cohort. Outside it,
	// a campaign waits: its commands are dropped, its state stays.
	Enabled bool
}

// Decision is a verdict and why.
type Decision struct {
	Verdict Verdict
	Reason  string
}

// Decide says what to do with the planning command for fence cmdFence of the
// campaign c at now, for a planner that must stop within timeLeft (negative:
// no limit).
func Decide(c Snapshot, cmdFence int64, now time.Time, timeLeft time.Duration) Decision {
	switch {
	case c.State != Planning:
		return Decision{Drop, fmt.Sprintf("campaign is %s", c.State)}
	case !c.Enabled:
		return Decision{Drop, "the campaign's tenant is not in the campaign cohort: it waits until an operator adds it"}
	case cmdFence > c.Fence:
		return Decision{Drop, fmt.Sprintf("command for fence %d is ahead of the campaign's %d (not published by a planner)", cmdFence, c.Fence)}
	case cmdFence < c.Fence && c.Continued < c.Fence && now.Sub(c.UpdatedAt) >= c.Lease:
		// The planner that committed had a lease's time to publish.
		return Decision{Republish, fmt.Sprintf("fence %d was committed but its command never confirmed", c.Fence)}
	case cmdFence < c.Fence:
		return Decision{Drop, fmt.Sprintf("command for fence %d is stale: the campaign is at %d", cmdFence, c.Fence)}
	case !now.Before(c.Deadline):
		return Decision{EndLate, fmt.Sprintf("the deadline %s passed", c.Deadline.UTC().Format(time.RFC3339))}
	case now.Add(c.Lease).After(c.Deadline):
		// A slice started now could commit after the deadline: none starts.
		return Decision{EndLate, fmt.Sprintf("the deadline %s is less than a lease (%s) away",
			c.Deadline.UTC().Format(time.RFC3339), c.Lease)}
	case timeLeft >= 0 && timeLeft < c.Lease:
		return Decision{Defer, fmt.Sprintf("%s left, a slice may take %s", timeLeft, c.Lease)}
	}
	return Decision{PlanSlice, fmt.Sprintf("slice %d", c.Fence+1)}
}
