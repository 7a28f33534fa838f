// Package clock lets every decision that depends on time (due times, deadlines,
// leases, backoff) take the time from one injectable source, so tests move time
// instead of sleeping.
package clock

import (
	"sync"
	"time"
)

// Clock tells the current time. Production code uses Real; tests use *Fake.
type Clock interface {
	Now() time.Time
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// After returns a channel that receives c's time once d has passed on c, so
// a loop's pause between passes goes through the injected clock: on a *Fake
// it ends when the test advances the clock past it, not when wall time
// passes. Clocks that follow the wall clock (Real, Shifted) wait on it.
func After(c Clock, d time.Duration) <-chan time.Time {
	if f, ok := c.(*Fake); ok {
		return f.after(d)
	}
	return time.After(d)
}

// Fake is a manually advanced clock, safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

func (f *Fake) after(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- f.now
		return ch
	}
	f.waiters = append(f.waiters, waiter{at: f.now.Add(d), ch: ch})
	return ch
}

// Waiters is how many waits (After) are pending on the fake: a test moves
// the clock once the code under test is waiting on it.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// fire ends the waits that are due; f.mu is held.
func (f *Fake) fire() {
	kept := f.waiters[:0]
	for _, w := range f.waiters {
		if w.at.After(f.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- f.now
	}
	f.waiters = kept
}

// NewFake returns a fake clock set to t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake's current time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the fake clock forward by d and ends the waits now due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	f.fire()
}

// Set moves the fake clock to t and ends the waits now due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
	f.fire()
}

// Shifted is the wall clock moved by an adjustable offset: time keeps
// flowing (so broker TTLs and real waits line up with it) while a test can
// jump ahead past a deadline or a lease.
type Shifted struct {
	mu     sync.Mutex
	offset time.Duration
}

// Now returns the wall clock plus the offset.
func (s *Shifted) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Add(s.offset)
}

// Advance moves the clock forward by d.
func (s *Shifted) Advance(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offset += d
}
