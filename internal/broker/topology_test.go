package broker_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/testenv"
)

func brokerURL() string {
	if u := os.Getenv("NUDGE_TEST_AMQP_URL"); u != "" {
		return u
	}
	return testenv.DefaultAMQPURL
}

// Regression (issue 13, finding 1): the dead-letter queues had no bound, so
// junk could fill the broker. Each now holds at most DeadMaxLength messages
// (and DeadMaxBytes of bodies) and, full, drops its oldest: publishes keep
// succeeding (the workers' dead-letter publishes never fail for it), and the
// newest dead letters are the ones kept.
func TestDeadLetterQueuesAreBoundedDroppingTheOldest(t *testing.T) {
	t.Parallel()
	testenv.RabbitMQ(t) // skips or fails loudly when there is no broker
	url := brokerURL()
	topo := undeclared(t, url)
	topo.DeadMaxLength = 3
	conn := dial(t, url)
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, topo.Declare(ch))
	require.NoError(t, ch.Close())

	pub := broker.NewPublisher(url, topo, "topology-test")
	defer pub.Close()
	var out []broker.Outgoing
	for i := 1; i <= 5; i++ {
		out = append(out, broker.Outgoing{Exchange: topo.DeadExchange(), RoutingKey: "email",
			Msg: amqp.Publishing{MessageId: strconv.Itoa(i), Body: []byte("junk"), DeliveryMode: amqp.Persistent}})
	}
	res, err := pub.PublishBatch(context.Background(), out)
	require.NoError(t, err)
	for i, r := range res {
		require.NoError(t, r, "publish %d into a full dead-letter queue is confirmed", i+1)
	}

	ch, err = conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	var kept []string
	for {
		d, ok, err := ch.Get(topo.DeadQueue("email"), false)
		require.NoError(t, err)
		if !ok {
			break
		}
		kept = append(kept, d.MessageId)
	}
	require.Equal(t, []string{"3", "4", "5"}, kept, "the oldest two were dropped")

	// Re-declaring with other bounds is refused, naming the way out.
	other := topo
	other.DeadMaxLength = 4
	ch2, err := conn.Channel()
	require.NoError(t, err)
	err = other.Declare(ch2)
	require.ErrorContains(t, err, "Bounded dead-letter queues")
}

// The byte bound too: a dead-letter queue keeps at most DeadMaxBytes of
// bodies, dropping the oldest, so one junk body cannot fill the broker.
func TestDeadLetterQueuesAreBoundedInBytes(t *testing.T) {
	t.Parallel()
	testenv.RabbitMQ(t)
	url := brokerURL()
	topo := undeclared(t, url)
	topo.DeadMaxBytes = 10
	conn := dial(t, url)
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, topo.Declare(ch))

	pub := broker.NewPublisher(url, topo, "topology-test")
	defer pub.Close()
	var out []broker.Outgoing
	for i := 1; i <= 3; i++ {
		out = append(out, broker.Outgoing{Exchange: topo.DeadExchange(), RoutingKey: "sms",
			Msg: amqp.Publishing{MessageId: strconv.Itoa(i), Body: []byte("6bytes"), DeliveryMode: amqp.Persistent}})
	}
	res, err := pub.PublishBatch(context.Background(), out)
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r)
	}
	q, err := ch.QueueDeclarePassive(topo.DeadQueue("sms"), true, false, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, 1, q.Messages, "two 6-byte bodies exceed 10 bytes: only the newest is kept")
	d, ok, err := ch.Get(topo.DeadQueue("sms"), false)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "3", d.MessageId)
}

func TestDefaultDeadLetterBounds(t *testing.T) {
	t.Parallel()
	topo := broker.Topology{}.WithDefaults()
	require.Equal(t, broker.DefaultDeadMaxLength, topo.DeadMaxLength)
	require.Equal(t, broker.DefaultDeadMaxBytes, topo.DeadMaxBytes)
}

// deploy/rabbitmq/rabbitmq.conf bounds every message the broker accepts:
// above anything Nudge publishes (a message body, MaxBodyBytes, which a dead
// letter carries unchanged), far below the 128 MiB RabbitMQ 3.10 allows.
func TestBrokerConfigBoundsMessageSize(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../../deploy/rabbitmq/rabbitmq.conf")
	require.NoError(t, err)
	defer f.Close()
	settings := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "rabbitmq.conf: %q is not key = value", line)
		settings[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	require.NoError(t, sc.Err())
	size, err := strconv.Atoi(settings["max_message_size"])
	require.NoError(t, err, "max_message_size must be set to a number of bytes")
	require.GreaterOrEqual(t, size, message.MaxBodyBytes, "room for every message Nudge publishes")
	require.LessOrEqual(t, size, 1<<20, fmt.Sprintf("max_message_size %d: bodies are bounded to a few KiB", size))
}
