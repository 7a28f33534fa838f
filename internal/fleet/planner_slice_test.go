package fleet_test

import (
	"context"
	"testing"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fleet"
	"github.com/nudgehq/nudge/internal/probe"
)

// The planner's slice size is a configuration value (--slice-size,
// NUDGE_SLICE_SIZE), 200 by default, refused out of bounds before anything
// connects.
func TestPlannerSliceSizeIsBoundedConfiguration(t *testing.T) {
	t.Parallel()
	var o fleet.Planner
	fs := pflag.NewFlagSet("planner", pflag.ContinueOnError)
	o.RegisterFlags(fs)
	require.NoError(t, fs.Parse(nil))
	require.Equal(t, campaign.DefaultSliceSize, o.SliceSize)
	for _, bad := range []string{"0", "10001"} {
		require.NoError(t, fs.Parse([]string{"--slice-size", bad}))
		err := o.Run(context.Background(), fleet.Env{Log: zerolog.Nop(), Registry: probe.NewRegistry(), Clock: clock.Real{}})
		require.ErrorContains(t, err, "--slice-size: slice size "+bad+" is out of range: want 1 to 10000 audience rows")
	}
}
