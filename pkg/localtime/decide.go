package localtime

import (
	"fmt"
	"time"
)

// Verdict is what a worker does with a reminder about to be sent.
type Verdict int

// The verdicts of Decide.
const (
	// Send: the window is open now.
	Send Verdict = iota
	// Defer: wait until Decision.At, the next usable opening.
	Defer
	// Expire: no usable opening starts before the deadline.
	Expire
)

func (v Verdict) String() string {
	switch v {
	case Send:
		return "send"
	case Defer:
		return "defer"
	case Expire:
		return "expire"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Reasons Decide gives for Expire.
const (
	// ReasonNoWindow: the window does not open (for long enough) before the deadline.
	ReasonNoWindow = "no_window_before_deadline"
	// ReasonDeadline: now is already within margin of the deadline.
	ReasonDeadline = "deadline"
)

// Decision is Decide's answer.
type Decision struct {
	Verdict Verdict
	// At is when to try again, for Defer (an opening, in the window's zone).
	At time.Time
	// Reason says why, for Expire.
	Reason string
}

// maxDecideSteps bounds Decide's walk over openings too short for margin
// (about two years of daily openings).
const maxDecideSteps = 800

// Decide judges a send at now against the window and the deadline. margin
// is how long a send needs: it may start at s only if the window stays open
// until at least s+margin and s+margin is before the deadline (margin 0: s
// is inside the window and before the deadline). It answers Send when now
// qualifies, Defer to the first opening that does, and Expire with
// ReasonNoWindow when none starts before the deadline (or ReasonDeadline
// when now+margin is already at or past it).
func Decide(w Window, loc *time.Location, now, deadline time.Time, margin time.Duration) Decision {
	if !now.Add(margin).Before(deadline) {
		return Decision{Verdict: Expire, Reason: ReasonDeadline}
	}
	s := now
	for range maxDecideSteps {
		s = NextOpening(w, loc, s)
		if s.IsZero() || !s.Add(margin).Before(deadline) {
			break
		}
		end := CloseAfter(w, loc, s)
		if end.IsZero() || !s.Add(margin).After(end) {
			if s.Equal(now) {
				return Decision{Verdict: Send}
			}
			return Decision{Verdict: Defer, At: s}
		}
		s = end // too short for margin: try the next opening
	}
	return Decision{Verdict: Expire, Reason: ReasonNoWindow}
}
