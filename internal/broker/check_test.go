package broker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/testenv"
)

// dial connects to the test broker and closes the connection at the end.
func dial(t *testing.T, url string) *amqp.Connection {
	t.Helper()
	conn, err := broker.Dial(url, "broker-test")
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// undeclared is a topology under a prefix of its own that nobody declared,
// deleted at the end in case the test declares it.
func undeclared(t *testing.T, url string) broker.Topology {
	t.Helper()
	topo := broker.Topology{Prefix: "t-" + testenv.RandomID()}.WithDefaults()
	t.Cleanup(func() {
		conn, err := broker.Dial(url, "broker-test-cleanup")
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_ = topo.Delete(ch)
		}
	})
	return topo
}

func TestCheckNamesEverythingMissingAndHowToDeclareIt(t *testing.T) {
	t.Parallel()
	mq := testenv.RabbitMQ(t)
	conn := dial(t, mq.URL)
	topo := undeclared(t, mq.URL)

	err := broker.Check(conn, topo.WorkerUses("email"))
	require.ErrorIs(t, err, broker.ErrTopologyMissing)
	var missing *broker.MissingError
	require.ErrorAs(t, err, &missing)
	want := []string{"exchange " + topo.WorkExchange(), "exchange " + topo.DeadExchange(), "exchange " + topo.RetryExchange("email"),
		"queue " + topo.Queue("email")}
	for _, d := range topo.RetryTiers {
		want = append(want, "queue "+topo.RetryQueue("email", d))
	}
	want = append(want, "queue "+topo.DeadQueue("email"))
	require.Equal(t, want, missing.Missing)
	require.Equal(t, "/", missing.Vhost)
	require.Contains(t, err.Error(), `vhost "/" has no exchange `+topo.WorkExchange())
	require.Contains(t, err.Error(), "nudgectl migrate --declare-topology")
	require.Contains(t, err.Error(), "--declare-topology (development)")
	require.False(t, conn.IsClosed(), "a failed passive declare closes its channel, never the connection")
}

func TestCheckPassesOnTheDeclaredTopologyAndNamesWhatIsDeleted(t *testing.T) {
	t.Parallel()
	mq := testenv.RabbitMQ(t)
	conn := dial(t, mq.URL)
	topo := mq.Topology.WithDefaults()
	for _, u := range []broker.Uses{topo.AllUses(), topo.PublisherUses(), topo.WorkerUses("email"), topo.WorkerUses("sms")} {
		require.NoError(t, broker.Check(conn, u))
	}

	gone := topo.RetryQueue("sms", topo.RetryTiers[2])
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDelete(gone, false, false, false)
	require.NoError(t, err)
	require.NoError(t, ch.Close())

	err = broker.Check(conn, topo.AllUses())
	var missing *broker.MissingError
	require.ErrorAs(t, err, &missing)
	require.Equal(t, []string{"queue " + gone}, missing.Missing, "only the deleted queue, though the checks after it ran on a new channel")
	require.NoError(t, broker.Check(conn, topo.WorkerUses("email")), "the email worker does not use it")
	require.ErrorIs(t, broker.Check(conn, topo.WorkerUses("sms")), broker.ErrTopologyMissing)
}

func TestPrepareDeclaresOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	mq := testenv.RabbitMQ(t)
	conn := dial(t, mq.URL)
	topo := undeclared(t, mq.URL)

	require.ErrorIs(t, topo.Prepare(conn, false, topo.PublisherUses()), broker.ErrTopologyMissing)
	require.NoError(t, topo.Prepare(conn, true, broker.Uses{}))
	require.NoError(t, broker.Check(conn, topo.AllUses()))
	require.NoError(t, topo.Prepare(conn, true, broker.Uses{}), "declaring again is idempotent")
	require.NoError(t, topo.PrepareAt(mq.URL, "broker-test", false, topo.PublisherUses()))
}

func TestPublisherNamesAMissingExchange(t *testing.T) {
	t.Parallel()
	mq := testenv.RabbitMQ(t)
	topo := undeclared(t, mq.URL)
	pub := broker.NewPublisher(mq.URL, topo, "broker-test")
	defer pub.Close()
	_, err := pub.PublishBatch(context.Background(), []broker.Outgoing{{Exchange: topo.WorkExchange(), RoutingKey: "email",
		Msg: amqp.Publishing{MessageId: "1-1", Body: []byte("{}")}}})
	require.ErrorIs(t, err, broker.ErrTopologyMissing)
	require.Contains(t, err.Error(), "exchange "+topo.WorkExchange())
	require.False(t, errors.Is(err, broker.ErrNotConfirmed), "nothing was attempted")
}

// Retries go through a channel's own retry exchange, which reaches that
// channel's retry tiers and nothing else; a tier dead-letters back to the
// channel's work queue.
func TestRetryExchangeReachesOnlyItsChannelsTiers(t *testing.T) {
	t.Parallel()
	mq := testenv.RabbitMQ(t)
	topo := mq.Topology.WithDefaults()
	pub := broker.NewPublisher(mq.URL, topo, "broker-test")
	defer pub.Close()
	tier := topo.RetryTiers[0]
	msg := func(id string) amqp.Publishing {
		return amqp.Publishing{MessageId: id, Body: []byte("{}"), DeliveryMode: amqp.Persistent}
	}
	results, err := pub.PublishBatch(context.Background(), []broker.Outgoing{
		{Exchange: topo.RetryExchange("email"), RoutingKey: topo.RetryQueue("email", tier), Msg: msg("r-1")},
		{Exchange: topo.RetryExchange("email"), RoutingKey: topo.RetryQueue("sms", tier), Msg: msg("r-2")},
		{Exchange: topo.RetryExchange("email"), RoutingKey: topo.Queue("sms"), Msg: msg("r-3")},
	})
	require.NoError(t, err)
	require.NoError(t, results[0], "the email tier through the email retry exchange")
	require.ErrorIs(t, results[1], broker.ErrUnroutable, "an sms tier through the email retry exchange")
	require.ErrorIs(t, results[2], broker.ErrUnroutable, "the sms work queue through the email retry exchange")

	conn := dial(t, mq.URL)
	ch, err := conn.Channel()
	require.NoError(t, err)
	defer ch.Close()
	require.Eventually(t, func() bool { // the tier's TTL passes: back on the work queue
		q, err := ch.QueueDeclarePassive(topo.Queue("email"), true, false, false, false, nil)
		require.NoError(t, err)
		return q.Messages == 1
	}, 10*time.Second, 20*time.Millisecond)
}
