// Package clock lets every decision that depends on time (due times, deadlines,
// leases, backoff) take the time from one injectable source, and every wait
// for time to pass (a rate-limit slot, a back-off) wait on that same source,
// so tests move time instead of sleeping.
package clock

import (
	"context"
	"sync"
	"time"
)

// Clock tells the current time. Production code uses Real; tests use *Fake
// or *Shifted.
type Clock interface {
	Now() time.Time
}

// Timers is a Clock that can also wait: After's channel receives once the
// clock has moved d past the time of the call. Real, *Fake and *Shifted are
// Timers; a Clock that is not waits on the wall clock (see After).
type Timers interface {
	Clock
	After(d time.Duration) <-chan time.Time
}

// After waits on c when c is Timers, and on the wall clock otherwise.
func After(c Clock, d time.Duration) <-chan time.Time {
	if t, ok := c.(Timers); ok {
		return t.After(d)
	}
	return time.After(d)
}

// Sleep waits until d has passed on c or ctx ends, and returns ctx.Err() in
// the second case. A d of zero or less returns at once.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-After(c, d):
		return nil
	}
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// After is time.After.
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// waiters are the pending Afters of a clock that can jump.
type waiters struct {
	list []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

// add registers a wait until at; one already due (at <= now) fires at once.
func (ws *waiters) add(now, at time.Time) <-chan time.Time {
	ch := make(chan time.Time, 1)
	if !at.After(now) {
		ch <- now
		return ch
	}
	ws.list = append(ws.list, waiter{at: at, ch: ch})
	return ch
}

// fire releases every wait due at now.
func (ws *waiters) fire(now time.Time) {
	keep := ws.list[:0]
	for _, w := range ws.list {
		if w.at.After(now) {
			keep = append(keep, w)
			continue
		}
		w.ch <- now // buffered, and sent to once
	}
	clear(ws.list[len(keep):])
	ws.list = keep
}

// Fake is a manually advanced clock, safe for concurrent use. Its Afters
// fire only when Advance or Set moves it to or past their time.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters waiters
}

// NewFake returns a fake clock set to t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake's current time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// After returns a channel that receives once the fake is moved d ahead.
func (f *Fake) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiters.add(f.now, f.now.Add(d))
}

// Waiters is how many Afters are pending: a test waits for the code under
// test to block on the clock before it moves the clock.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters.list)
}

// Advance moves the fake clock forward by d and fires the Afters now due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	f.waiters.fire(f.now)
}

// Set moves the fake clock to t and fires the Afters now due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
	f.waiters.fire(f.now)
}

// Shifted is the wall clock moved by an adjustable offset: time keeps
// flowing (so broker TTLs and real waits line up with it) while a test can
// jump ahead past a deadline or a lease. Its Afters fire when the wall clock
// gets there or when Advance jumps past them, whichever comes first.
type Shifted struct {
	mu      sync.Mutex
	offset  time.Duration
	waiters waiters
}

// NewShifted returns the wall clock moved by offset (negative: behind it).
func NewShifted(offset time.Duration) *Shifted { return &Shifted{offset: offset} }

// Now returns the wall clock plus the offset.
func (s *Shifted) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Add(s.offset)
}

// After returns a channel that receives once the shifted clock is d ahead.
func (s *Shifted) After(d time.Duration) <-chan time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().Add(s.offset)
	ch := s.waiters.add(now, now.Add(d))
	if d > 0 {
		time.AfterFunc(d, s.fire)
	}
	return ch
}

// Advance moves the clock forward by d and fires the Afters now due.
func (s *Shifted) Advance(d time.Duration) {
	s.mu.Lock()
	s.offset += d
	s.mu.Unlock()
	s.fire()
}

func (s *Shifted) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiters.fire(time.Now().Add(s.offset))
}
