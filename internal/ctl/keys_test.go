package ctl_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/message"
)

func TestKeysDerive(t *testing.T) {
	// Secrets of 32 bytes or more: the binaries refuse shorter root keys.
	const roots = "k2:fedcba9876543210fedcba9876543210,k1:0123456789abcdef0123456789abcdef"
	root, err := message.ParseKeys(roots)
	require.NoError(t, err)
	want, err := root.ChannelSpec("sms")
	require.NoError(t, err)

	// From the flag, and from the environment as the fleet's binaries read it.
	res := runCtl(t, "", nil, "keys", "derive", "--channel", "sms", "--signing-keys", roots)
	require.NoError(t, res.err, res.stderr)
	require.Equal(t, want+"\n", res.stdout)
	t.Setenv("NUDGE_SIGNING_KEYS", roots)
	res = runCtl(t, "", nil, "keys", "derive", "--channel", "sms")
	require.NoError(t, res.err, res.stderr)
	require.Equal(t, want+"\n", res.stdout)

	// What it prints is a worker's keyring: the SMS channel only.
	smsOnly, err := message.ParseKeys(strings.TrimSpace(res.stdout))
	require.NoError(t, err)
	require.True(t, smsOnly.CanSeal("sms"))
	require.False(t, smsOnly.CanSeal("email"))

	// The planner's keys: planning commands only, no channel's work.
	res = runCtl(t, "", nil, "keys", "derive", "--channel", "plan")
	require.NoError(t, res.err, res.stderr)
	planOnly, err := message.ParseKeys(strings.TrimSpace(res.stdout))
	require.NoError(t, err)
	require.True(t, planOnly.CanSeal("plan"))
	require.False(t, planOnly.CanSeal("email"))

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--channel", "fax"}, `--channel "fax": want email, sms, webhook or plan`},
		{[]string{"--channel", "sms", "--signing-keys", "k1:short"}, "at least 16 bytes"},
		{[]string{"--channel", "sms", "--signing-keys", want}, "channel keys only"},
	} {
		res := runCtl(t, "", nil, append([]string{"keys", "derive"}, tc.args...)...)
		require.ErrorContains(t, res.err, tc.want, "%v", tc.args)
	}
}
