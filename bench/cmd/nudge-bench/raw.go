package main

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/testenv"
)

// rawResult is one run of the raw broker benchmark.
type rawResult struct{ PublishRate, ConsumeRate float64 }

// rawBroker publishes n persistent 100-byte messages to a quorum queue of its
// own with publisher confirms in windows of `window`, then consumes them
// with manual acks (one ack per message, prefetch `window`). The queue is
// deleted at the end.
func rawBroker(ctx context.Context, e *env, n, window int) (rawResult, error) {
	var res rawResult
	conn, err := broker.Dial(e.amqpURL, "nudge-bench-raw")
	if err != nil {
		return res, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return res, err
	}
	q := "nudge-bench-raw-" + testenv.RandomID()
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return res, fmt.Errorf("declaring %s: %w", q, err)
	}
	defer func() {
		if c, err := conn.Channel(); err == nil {
			_, _ = c.QueueDelete(q, false, false, false)
		}
	}()
	if err := ch.Confirm(false); err != nil {
		return res, err
	}
	body := make([]byte, 100)
	for i := range body {
		body[i] = 'x'
	}
	start := time.Now()
	for sent := 0; sent < n; {
		w := min(window, n-sent)
		dcs := make([]*amqp.DeferredConfirmation, w)
		for i := range w {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, ContentType: "application/octet-stream", Body: body,
			})
			if err != nil {
				return res, err
			}
			dcs[i] = dc
		}
		for _, dc := range dcs {
			ok, err := dc.WaitContext(ctx)
			if err != nil || !ok {
				return res, fmt.Errorf("raw publish not confirmed: %v", err)
			}
		}
		sent += w
	}
	res.PublishRate = float64(n) / time.Since(start).Seconds()

	cch, err := conn.Channel()
	if err != nil {
		return res, err
	}
	if err := cch.Qos(window, 0, false); err != nil {
		return res, err
	}
	start = time.Now()
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		return res, err
	}
	for got := 0; got < n; got++ {
		select {
		case d := <-ds:
			if err := d.Ack(false); err != nil {
				return res, err
			}
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(30 * time.Second):
			return res, fmt.Errorf("raw consume stalled after %d of %d", got, n)
		}
	}
	res.ConsumeRate = float64(n) / time.Since(start).Seconds()
	_ = cch.Close()
	return res, nil
}
