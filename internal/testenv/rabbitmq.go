package testenv

import (
	"os"
	"testing"

	"github.com/nudgehq/nudge/internal/broker"
)

// DefaultAMQPURL is the RabbitMQ the tests use unless NUDGE_TEST_AMQP_URL says otherwise.
const DefaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

// Broker is an isolated topology for one test: every exchange and queue
// name carries a prefix of its own.
type Broker struct {
	URL      string
	Topology broker.Topology
}

// RabbitMQ checks the broker is reachable, declares a topology under a
// fresh prefix, and deletes it when the test ends. It plays the migration
// step: the workers, publishers and binaries under test only check that the
// topology exists, as they do in production.
func RabbitMQ(tb testing.TB) *Broker {
	tb.Helper()
	b := UndeclaredRabbitMQ(tb)
	conn, err := broker.Dial(b.URL, "nudge-test")
	if err != nil {
		tb.Fatalf("connecting to RabbitMQ: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatalf("opening a channel: %v", err)
	}
	if err := b.Topology.Declare(ch); err != nil {
		tb.Fatalf("declaring test topology: %v", err)
	}
	return b
}

// UndeclaredRabbitMQ is RabbitMQ without the declaring: a fresh prefix with
// nothing under it yet, for a test whose migration step declares it (with an
// earlier release's nudgectl, say). What this release's topology names under
// the prefix is deleted when the test ends.
func UndeclaredRabbitMQ(tb testing.TB) *Broker {
	tb.Helper()
	needs(tb, "RabbitMQ")
	url := os.Getenv("NUDGE_TEST_AMQP_URL")
	if url == "" {
		url = DefaultAMQPURL
	}
	conn, err := broker.Dial(url, "nudge-test")
	if err != nil {
		Unavailable(tb, "RabbitMQ at "+url, "start it (rabbitmq-server -detached), or set NUDGE_TEST_AMQP_URL", err)
		return nil
	}
	conn.Close()
	topo := broker.Topology{Prefix: "t-" + RandomID()}.WithDefaults()
	b := &Broker{URL: url, Topology: topo}
	tb.Cleanup(func() {
		conn, err := broker.Dial(url, "nudge-test-cleanup")
		if err != nil {
			return
		}
		defer conn.Close()
		// Both shapes: a test may have changed the tiers after this declared them.
		for _, t := range []broker.Topology{topo, b.Topology.WithDefaults()} {
			if ch, err := conn.Channel(); err == nil {
				_ = t.Delete(ch)
			}
		}
	})
	return b
}
