package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/store"
)

// The shared provider choice: created on the first provider, counts only
// against the current provider, windows restart, one switch of many, one
// probe of many.
func TestFailoverSharedState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()

	cur, probe, err := b.st.FailoverCurrent(ctx, "sms", "a", now)
	require.NoError(t, err)
	require.Equal(t, "a", cur)
	require.True(t, probe.IsZero())
	cur, _, err = b.st.FailoverCurrent(ctx, "sms", "b", now)
	require.NoError(t, err)
	require.Equal(t, "a", cur, "the row exists: first is only the starting point")

	c, ok, err := b.st.FailoverCount(ctx, "sms", "a", 0, true, now, time.Minute)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, store.FailoverCounts{Failures: 1, Sends: 1, Failed: 1}, c)
	c, _, err = b.st.FailoverCount(ctx, "sms", "a", 0, true, now.Add(time.Second), time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.FailoverCounts{Failures: 2, Sends: 2, Failed: 2}, c)
	c, _, err = b.st.FailoverCount(ctx, "sms", "a", 1, false, now.Add(2*time.Second), time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.FailoverCounts{Failures: 0, Sends: 3, Failed: 2}, c, "a success ends the run of failures, not the window")
	c, _, err = b.st.FailoverCount(ctx, "sms", "a", 0, true, now.Add(3*time.Second), time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.FailoverCounts{Failures: 1, Sends: 4, Failed: 3}, c)
	c, _, err = b.st.FailoverCount(ctx, "sms", "a", 5, true, now.Add(4*time.Second), time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.FailoverCounts{Failures: 1, Sends: 10, Failed: 4}, c,
		"a batch of successes, then a failure: the run of failures starts again at one")
	c, _, err = b.st.FailoverCount(ctx, "sms", "a", 0, true, now.Add(time.Minute), time.Minute)
	require.NoError(t, err)
	require.Equal(t, store.FailoverCounts{Failures: 2, Sends: 1, Failed: 1}, c, "the window restarted; the run of failures goes on")
	_, ok, err = b.st.FailoverCount(ctx, "sms", "b", 0, true, now, time.Minute)
	require.NoError(t, err)
	require.False(t, ok, "b is not current: nothing counted")

	// Four workers trip at once: one switch.
	var wg sync.WaitGroup
	var mu sync.Mutex
	switched := 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := b.st.FailoverSwitch(ctx, "sms", "a", "b", now, now.Add(10*time.Second))
			assert.NoError(t, err)
			if ok {
				mu.Lock()
				switched++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 1, switched)
	cur, probe, err = b.st.FailoverCurrent(ctx, "sms", "a", now)
	require.NoError(t, err)
	require.Equal(t, "b", cur)
	require.Equal(t, now.Add(10*time.Second), probe.UTC())

	ok, err = b.st.FailoverClaimProbe(ctx, "sms", "a", now.Add(9*time.Second), now.Add(20*time.Second))
	require.NoError(t, err)
	require.False(t, ok, "not due yet")
	won := 0
	for range 3 {
		ok, err = b.st.FailoverClaimProbe(ctx, "sms", "a", now.Add(10*time.Second), now.Add(20*time.Second))
		require.NoError(t, err)
		if ok {
			won++
		}
	}
	require.Equal(t, 1, won, "one probe per due time")

	ok, err = b.st.FailoverSwitch(ctx, "sms", "b", "a", now.Add(11*time.Second), time.Time{})
	require.NoError(t, err)
	require.True(t, ok)
	cur, probe, err = b.st.FailoverCurrent(ctx, "sms", "a", now)
	require.NoError(t, err)
	require.Equal(t, "a", cur)
	require.True(t, probe.IsZero(), "back on the first provider: no probe")
	ok, err = b.st.FailoverClaimProbe(ctx, "sms", "a", now.Add(time.Hour), now.Add(2*time.Hour))
	require.NoError(t, err)
	require.False(t, ok, "nothing to probe on the first provider")
}

// Regression: workers starting together each create the channel's row; the
// ones whose insert waited for another's used to find no row at all.
func TestFailoverCurrentFromWorkersStartingTogether(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for round := range 5 {
		channel := "sms-" + string(rune('a'+round))
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cur, _, err := b.st.FailoverCurrent(ctx, channel, "twilio", b.clock.Now())
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, "twilio", cur)
			}()
		}
		wg.Wait()
	}
}
