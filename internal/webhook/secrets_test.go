package webhook

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/webhooksig"
)

func TestParseSecrets(t *testing.T) {
	t.Parallel()
	s, err := ParseSecrets("w2:" + strings.Repeat("b", 32) + ", w1:" + strings.Repeat("a", 40))
	require.NoError(t, err)
	require.Equal(t, []Secret{{"w2", []byte(strings.Repeat("b", 32))}, {"w1", []byte(strings.Repeat("a", 40))}}, s)
	require.Len(t, Roots(s), 2)

	for _, bad := range []string{"", "w1:short", "w1:CHANGE-ME-0123456789abcdef0123456789", "nokid",
		"w1@webhook:" + strings.Repeat("ab", 32)} {
		_, err := ParseSecrets(bad)
		require.ErrorIs(t, err, ErrInvalidConfig, bad)
		require.NotContains(t, err.Error(), "0123456789abcdef0123456789", "errors never show a secret")
	}
}

// The operator hands each tenant one line per root secret: what its
// application verifies with, equal to what the worker signs with.
func TestWriteTenantSecrets(t *testing.T) {
	t.Parallel()
	s, err := ParseSecrets("w2:" + strings.Repeat("b", 32) + ",w1:" + strings.Repeat("a", 32))
	require.NoError(t, err)
	var b strings.Builder
	require.NoError(t, WriteTenantSecrets(&b, s, "acme"))
	require.Equal(t, "w2 "+string(webhooksig.TenantSecret(s[0].Root, "acme"))+"\n"+
		"w1 "+string(webhooksig.TenantSecret(s[1].Root, "acme"))+"\n", b.String())
	require.ErrorIs(t, WriteTenantSecrets(&b, s, " "), ErrInvalidConfig)
}
