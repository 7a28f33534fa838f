package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// A worker never declares the topology unless told to: on a broker where it
// is missing it stops at once, naming its queues, instead of retrying.
func TestWorkerStopsWhenItsQueuesAreMissing(t *testing.T) {
	t.Parallel()
	mq := testenv.RabbitMQ(t)
	topo := broker.Topology{Prefix: "t-" + testenv.RandomID()}.WithDefaults()
	newWorker := func(declare bool) *worker.Worker {
		w, err := worker.New(worker.Config{Channel: reminder.SMS}, worker.Deps{AMQPURL: mq.URL, Topology: topo,
			Log: zerolog.New(zerolog.NewTestWriter(t)), DeclareTopology: declare})
		require.NoError(t, err)
		return w
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := newWorker(false).Run(ctx)
	require.ErrorIs(t, err, broker.ErrTopologyMissing)
	require.Contains(t, err.Error(), "queue "+topo.Queue("sms"))
	require.NotContains(t, err.Error(), "queue "+topo.Queue("email"), "only what the SMS worker uses")
	require.NoError(t, ctx.Err(), "stopped at once, without a reconnect loop")

	// With DeclareTopology (development) it declares, then consumes.
	t.Cleanup(func() {
		if conn, err := broker.Dial(mq.URL, "worker-test-cleanup"); err == nil {
			defer conn.Close()
			if ch, err := conn.Channel(); err == nil {
				_ = topo.Delete(ch)
			}
		}
	})
	w := newWorker(true)
	done := make(chan error, 1)
	runCtx, stop := context.WithCancel(context.Background())
	go func() { done <- w.Run(runCtx) }()
	require.Eventually(t, w.Ready, 10*time.Second, 10*time.Millisecond)
	stop()
	require.NoError(t, <-done)
	require.NoError(t, topo.PrepareAt(mq.URL, "worker-test", false, topo.AllUses()))
}
