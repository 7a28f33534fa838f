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

// Fake is a manually advanced clock, safe for concurrent use.
type Fake struct {
	mu  sync.Mutex
	now time.Time
}

// NewFake returns a fake clock set to t.
func NewFake(t time.Time) *Fake { return &Fake{now: t} }

// Now returns the fake's current time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves the fake clock forward by d.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
}

// Set moves the fake clock to t.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
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
