package clock_test

import (
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/clock"
)

func ready(ch <-chan time.Time) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A wait on a fake clock ends when the clock is moved past it, never before.
func TestFakeAfterEndsWhenTheClockIsMoved(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	f := clock.NewFake(start)
	ten, twenty := clock.After(f, 10*time.Second), clock.After(f, 20*time.Second)
	if got := f.Waiters(); got != 2 {
		t.Fatalf("Waiters = %d, want 2", got)
	}
	if !ready(clock.After(f, 0)) {
		t.Error("a wait of 0 must end at once")
	}
	f.Advance(9 * time.Second)
	if ready(ten) || ready(twenty) {
		t.Fatal("a wait ended before its time")
	}
	f.Advance(time.Second)
	if !ready(ten) || ready(twenty) {
		t.Fatal("after 10s: want the 10s wait ended, the 20s one pending")
	}
	f.Set(start.Add(time.Minute))
	if !ready(twenty) {
		t.Fatal("Set past the 20s wait must end it")
	}
	if got := f.Waiters(); got != 0 {
		t.Errorf("Waiters = %d, want 0", got)
	}
}

// Clocks following the wall clock wait on it.
func TestRealAfterWaitsOnTheWallClock(t *testing.T) {
	t.Parallel()
	select {
	case <-clock.After(clock.Real{}, time.Millisecond):
	case <-time.After(10 * time.Second):
		t.Fatal("a 1ms wait on the real clock did not end")
	}
}
