package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// heldWarm is the store with a Warm the test holds: it reports how many
// connections it was asked for, then waits for release (or its context).
type heldWarm struct {
	*store.Store
	asked   chan int
	ended   chan error // the context's error when Warm returned
	release chan struct{}
}

func (h heldWarm) Warm(ctx context.Context, n int) error {
	h.asked <- n
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	h.ended <- ctx.Err()
	return nil
}

// A worker opens its database connections (one per batch slot and one
// more) before it consumes, so before it is ready; a warm-up that does not
// end within its bound (10 s, on the worker's clock) is given up, and the
// worker consumes anyway.
func TestWorkerWarmsItsConnectionsBeforeConsuming(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	mq := testenv.RabbitMQ(t)
	keys, err := message.ParseKeys("test:0123456789abcdef0123")
	require.NoError(t, err)
	consumers := func(t *testing.T) int {
		t.Helper()
		conn, err := broker.Dial(mq.URL, "warm-test")
		require.NoError(t, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(t, err)
		q, err := ch.QueueDeclarePassive(mq.Topology.WithDefaults().Queue(string(reminder.SMS)), true, false, false, false, nil)
		require.NoError(t, err)
		return q.Consumers
	}
	start := func(t *testing.T, clk clock.Clock) (*worker.Worker, heldWarm) {
		t.Helper()
		h := heldWarm{Store: store.New(db.Pool), asked: make(chan int, 1), ended: make(chan error, 1), release: make(chan struct{})}
		w, err := worker.New(worker.Config{Channel: reminder.SMS, Name: "warm-" + testenv.RandomID(), Concurrency: 2},
			worker.Deps{AMQPURL: mq.URL, Topology: mq.Topology, Store: h, Sender: nopSender{}, Keys: keys,
				Clock: clk, Log: zerolog.Nop()})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			require.NoError(t, <-done)
		})
		return w, h
	}

	asked := func(t *testing.T, h heldWarm) int {
		t.Helper()
		select {
		case n := <-h.asked:
			return n
		case <-time.After(10 * time.Second):
			t.Fatal("the worker did not warm its store")
			return 0
		}
	}

	t.Run("consumes once warmed", func(t *testing.T) {
		w, h := start(t, clock.Real{})
		require.Equal(t, 3, asked(t, h), "Concurrency 2: three connections")
		// Warm is called before the first broker session: while it runs
		// there is no consumer and the worker is not ready.
		require.False(t, w.Ready())
		require.Zero(t, consumers(t))
		close(h.release)
		require.NoError(t, <-h.ended)
		require.Eventually(t, w.Ready, 10*time.Second, 10*time.Millisecond)
		require.Equal(t, 1, consumers(t))
	})
	t.Run("gives up after its bound", func(t *testing.T) {
		clk := clock.NewFake(time.Now())
		w, h := start(t, clk)
		asked(t, h)
		require.Eventually(t, func() bool { return clk.Waiters() > 0 }, 10*time.Second, time.Millisecond)
		clk.Advance(9 * time.Second)
		require.False(t, w.Ready(), "still warming within 10 s")
		clk.Advance(time.Second)
		require.ErrorIs(t, <-h.ended, context.Canceled, "the warm-up is canceled")
		require.Eventually(t, w.Ready, 10*time.Second, 10*time.Millisecond, "and the worker consumes without it")
	})
}
