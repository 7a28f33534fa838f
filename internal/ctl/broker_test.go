package ctl_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/testenv"
)

// freshTopology is a prefix nobody declared on the test broker, deleted at
// the end.
func freshTopology(t *testing.T) (url string, topo broker.Topology) {
	t.Helper()
	mq := testenv.RabbitMQ(t)
	topo = broker.Topology{Prefix: "t-" + testenv.RandomID()}.WithDefaults()
	t.Cleanup(func() {
		conn, err := broker.Dial(mq.URL, "ctl-test-cleanup")
		if err != nil {
			return
		}
		defer conn.Close()
		for _, t := range []broker.Topology{topo, topo.Planning()} {
			if ch, err := conn.Channel(); err == nil {
				_ = t.Delete(ch)
			}
		}
	})
	return mq.URL, topo
}

func TestBrokerDeclareThenCheck(t *testing.T) {
	t.Parallel()
	url, topo := freshTopology(t)
	run := func(args ...string) ctlResult {
		// The broker commands never open the database.
		return runCtl(t, "postgres://unused.invalid/nudge?sslmode=verify-full", nil,
			append(args, "--amqp-url", url, "--queue-prefix", topo.Prefix)...)
	}

	res := run("broker", "check")
	require.ErrorIs(t, res.err, broker.ErrTopologyMissing)
	require.Contains(t, res.err.Error(), "exchange "+topo.WorkExchange())
	require.Contains(t, res.err.Error(), "queue "+topo.DeadQueue("sms"))

	res = run("broker", "declare")
	require.NoError(t, res.err)
	require.Contains(t, res.stdout, "declared the broker topology: exchanges "+topo.WorkExchange())

	res = run("broker", "check")
	require.NoError(t, res.err)
	require.Contains(t, res.stdout, "the broker topology is complete")
}

func TestMigrateDeclaresTheTopologyOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	b := setupCtl(t)
	url, topo := freshTopology(t)

	res := b.run("migrate", "--amqp-url", url, "--queue-prefix", topo.Prefix)
	require.NoError(t, res.err)
	require.NotContains(t, res.stdout, "declared")
	require.ErrorIs(t, topo.PrepareAt(url, "ctl-test", false, topo.AllUses()), broker.ErrTopologyMissing)

	res = b.run("migrate", "--declare-topology", "--amqp-url", url, "--queue-prefix", topo.Prefix)
	require.NoError(t, res.err)
	require.Regexp(t, `^(schema is up to date|no migration to apply before the rollout completes)\n`, res.stdout)
	require.Contains(t, res.stdout, "declared the broker topology")
	require.NoError(t, topo.PrepareAt(url, "ctl-test", false, topo.AllUses()))
	require.NoError(t, topo.Planning().PrepareAt(url, "ctl-test", false, topo.Planning().AllUses()),
		"the planning queue is declared too")
}
