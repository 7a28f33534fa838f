package provider_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/provider"
)

// TestWithTimeoutBoundsByTheEarlierDeadline: a request's context ends at
// the earlier of the caller's deadline and the adapter's timeout.
func TestWithTimeoutBoundsByTheEarlierDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		caller  time.Duration // 0: no deadline
		timeout time.Duration
		want    time.Duration
	}{
		{"no caller deadline", 0, time.Minute, time.Minute},
		{"caller's deadline first", time.Minute, time.Hour, time.Minute},
		{"timeout first", time.Hour, time.Minute, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			if tc.caller > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.caller)
				defer cancel()
			}
			start := time.Now()
			got, cancel := provider.WithTimeout(ctx, tc.timeout)
			d, ok := got.Deadline()
			require.True(t, ok)
			require.WithinDuration(t, start.Add(tc.want), d, time.Second, "deadline")
			cancel()
			if tc.caller > 0 && tc.caller <= tc.timeout {
				require.Same(t, ctx, got, "the caller's context, with no timer of its own")
				require.NoError(t, got.Err(), "cancel leaves the caller's context alone")
			} else {
				require.ErrorIs(t, got.Err(), context.Canceled, "cancel ends the child")
			}
		})
	}
}
