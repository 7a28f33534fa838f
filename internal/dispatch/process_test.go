package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/testenv"
)

// The dispatcher and the reconciler check the topology before anything else
// touches the broker: a missing work queue stops them at start, by name.
func TestStartChecksTheTopologyAndDeclaresOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	db, mq := testenv.Postgres(t), testenv.RabbitMQ(t)
	common := config.Common{DatabaseURL: db.URL, AMQPURL: mq.URL, SigningKeys: "test:0123456789abcdef0123",
		QueuePrefix: "t-" + testenv.RandomID(), LogLevel: "warn", LogFormat: "json"}
	topo := common.Topology()
	t.Cleanup(func() {
		if conn, err := broker.Dial(mq.URL, "dispatch-test-cleanup"); err == nil {
			defer conn.Close()
			if ch, err := conn.Channel(); err == nil {
				_ = topo.Delete(ch)
			}
		}
	})

	_, err := dispatch.Start(&common, "dispatcher", nil)
	require.ErrorIs(t, err, broker.ErrTopologyMissing)
	require.Contains(t, err.Error(), "exchange "+topo.WorkExchange()+", queue "+topo.Queue("email")+", queue "+topo.Queue("sms"))

	common.DeclareTopology = true
	p, err := dispatch.Start(&common, "dispatcher", nil)
	require.NoError(t, err)
	p.Close()

	common.DeclareTopology = false
	p, err = dispatch.Start(&common, "reconciler", nil)
	require.NoError(t, err, "declared now: the check passes")
	p.Close()
}
