package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
)

var t0 = time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)

func fired(ch <-chan time.Time) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestFakeAfterFiresOnlyWhenMovedPastItsTime(t *testing.T) {
	t.Parallel()
	f := clock.NewFake(t0)
	soon, later := f.After(time.Second), f.After(time.Minute)
	require.Equal(t, 2, f.Waiters())
	require.True(t, fired(f.After(0)), "a wait of zero is due at once")
	require.Equal(t, 2, f.Waiters(), "and is not pending")

	f.Advance(999 * time.Millisecond)
	require.False(t, fired(soon), "not yet")
	f.Advance(time.Millisecond)
	require.True(t, fired(soon), "exactly at its time")
	require.False(t, fired(later))
	require.Equal(t, 1, f.Waiters())

	f.Set(t0.Add(time.Hour))
	require.True(t, fired(later))
	require.Zero(t, f.Waiters())
}

func TestSleepOnAFakeReturnsWhenAdvancedOrCanceled(t *testing.T) {
	t.Parallel()
	f := clock.NewFake(t0)
	done := make(chan error, 1)
	go func() { done <- clock.Sleep(context.Background(), f, time.Hour) }()
	require.Eventually(t, func() bool { return f.Waiters() == 1 }, 5*time.Second, time.Millisecond)
	f.Advance(time.Hour)
	require.NoError(t, <-done)

	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- clock.Sleep(ctx, f, time.Hour) }()
	require.Eventually(t, func() bool { return f.Waiters() == 1 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.NoError(t, clock.Sleep(context.Background(), f, 0), "no wait at all")
}

// A jump of a shifted clock releases what waits for the time it jumped to,
// without waiting for the wall clock to get there.
func TestShiftedAfterFiresOnAdvance(t *testing.T) {
	t.Parallel()
	s := clock.NewShifted(-time.Hour)
	require.WithinDuration(t, time.Now().Add(-time.Hour), s.Now(), time.Minute)
	ch := s.After(time.Hour)
	require.False(t, fired(ch))
	s.Advance(time.Hour)
	require.True(t, fired(ch))

	// Without a jump the wall clock gets there.
	require.NoError(t, clock.Sleep(context.Background(), s, time.Millisecond))
}

// A clock that cannot wait (only Now) waits on the wall clock.
type nowOnly struct{}

func (nowOnly) Now() time.Time { return t0 }

func TestAfterFallsBackToTheWallClock(t *testing.T) {
	t.Parallel()
	require.NoError(t, clock.Sleep(context.Background(), nowOnly{}, time.Millisecond))
	require.NoError(t, clock.Sleep(context.Background(), clock.Real{}, time.Millisecond))
}
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
