package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/testenv"
)

// rawResult is one run of the raw broker benchmark: publishing alone,
// consuming alone, and both at once (msg/s).
type rawResult struct{ PublishRate, ConsumeRate, BothRate float64 }

// rawBody is the payload of every raw message: 100 bytes.
var rawBody = func() []byte {
	b := make([]byte, 100)
	for i := range b {
		b[i] = 'x'
	}
	return b
}()

// rawBroker runs the three raw broker measurements one after the other, each
// on a quorum queue of its own: rawSequential (publish alone, then consume
// alone), then rawBoth (publish and consume at once).
func rawBroker(ctx context.Context, e *env, n, window int) (rawResult, error) {
	res, err := rawSequential(ctx, e, n, window)
	if err != nil {
		return res, err
	}
	if res.BothRate, err = rawBoth(ctx, e, n, window); err != nil {
		return res, fmt.Errorf("publishing and consuming at once: %w", err)
	}
	return res, nil
}

// rawQueue declares a quorum queue of its own on ch (named as every raw
// queue: nudge-bench-raw-<random>) and returns its name and a function that
// deletes it over a connection of its own, so that it goes even when the
// connections of the run failed.
func rawQueue(e *env, ch *amqp.Channel) (string, func(), error) {
	q := "nudge-bench-raw-" + testenv.RandomID()
	if _, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err != nil {
		return "", nil, fmt.Errorf("declaring %s: %w", q, err)
	}
	return q, func() {
		conn, err := broker.Dial(e.amqpURL, "nudge-bench-raw-cleanup")
		if err != nil {
			return
		}
		defer conn.Close()
		if c, err := conn.Channel(); err == nil {
			_, _ = c.QueueDelete(q, false, false, false)
		}
	}, nil
}

// rawPublish publishes n persistent rawBody messages to q with publisher
// confirms in windows of `window` (publish a window, wait for its confirms).
// start, when not nil, is called just before the first publish.
func rawPublish(ctx context.Context, ch *amqp.Channel, q string, n, window int, start func()) error {
	if err := ch.Confirm(false); err != nil {
		return err
	}
	if start != nil {
		start()
	}
	for sent := 0; sent < n; {
		w := min(window, n-sent)
		dcs := make([]*amqp.DeferredConfirmation, w)
		for i := range w {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, false, false, amqp.Publishing{
				DeliveryMode: amqp.Persistent, ContentType: "application/octet-stream", Body: rawBody,
			})
			if err != nil {
				return err
			}
			dcs[i] = dc
		}
		for _, dc := range dcs {
			ok, err := dc.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("raw publish not confirmed after %d of %d: %w", sent, n, err)
			}
			if !ok {
				return fmt.Errorf("raw publish nacked after %d of %d", sent, n)
			}
		}
		sent += w
	}
	return nil
}

// rawConsume takes n messages from ds and acks each one on its own. It gives
// up when no message came for 30 seconds.
func rawConsume(ctx context.Context, ds <-chan amqp.Delivery, n int) error {
	stall := time.NewTimer(30 * time.Second)
	defer stall.Stop()
	for got := 0; got < n; got++ {
		select {
		case d, ok := <-ds:
			if !ok {
				return fmt.Errorf("raw consume: channel closed after %d of %d", got, n)
			}
			if err := d.Ack(false); err != nil {
				return err
			}
			stall.Reset(30 * time.Second)
		case <-ctx.Done():
			return ctx.Err()
		case <-stall.C:
			return fmt.Errorf("raw consume stalled after %d of %d", got, n)
		}
	}
	return nil
}

// rawSequential publishes n persistent 100-byte messages to a quorum queue
// of its own with publisher confirms in windows of `window`, then consumes
// them with manual acks (one ack per message, prefetch `window`). The queue
// is deleted at the end.
func rawSequential(ctx context.Context, e *env, n, window int) (rawResult, error) {
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
	q, del, err := rawQueue(e, ch)
	if err != nil {
		return res, err
	}
	defer del()
	var start time.Time
	if err := rawPublish(ctx, ch, q, n, window, func() { start = time.Now() }); err != nil {
		return res, err
	}
	res.PublishRate = float64(n) / time.Since(start).Seconds()
	e.measuredSince(start)

	cch, err := conn.Channel()
	if err != nil {
		return res, err
	}
	defer cch.Close()
	if err := cch.Qos(window, 0, false); err != nil {
		return res, err
	}
	start = time.Now()
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		return res, err
	}
	if err := rawConsume(ctx, ds, n); err != nil {
		return res, err
	}
	res.ConsumeRate = float64(n) / time.Since(start).Seconds()
	e.measuredSince(start)
	return res, nil
}

// rawBoth runs a publisher (confirms in windows of `window`, persistent
// 100-byte messages) and a consumer (manual ack per message, prefetch
// `window`) at the same time on a quorum queue of its own, each over a
// connection of its own, and returns n / (first publish → last ack). The
// consumer is subscribed before the first publish. The queue is deleted at
// the end, whatever happened.
func rawBoth(ctx context.Context, e *env, n, window int) (float64, error) {
	pconn, err := broker.Dial(e.amqpURL, "nudge-bench-raw-publisher")
	if err != nil {
		return 0, err
	}
	defer pconn.Close()
	cconn, err := broker.Dial(e.amqpURL, "nudge-bench-raw-consumer")
	if err != nil {
		return 0, err
	}
	defer cconn.Close()
	pch, err := pconn.Channel()
	if err != nil {
		return 0, err
	}
	q, del, err := rawQueue(e, pch)
	if err != nil {
		return 0, err
	}
	defer del()
	cch, err := cconn.Channel()
	if err != nil {
		return 0, err
	}
	if err := cch.Qos(window, 0, false); err != nil {
		return 0, err
	}
	ds, err := cch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg          sync.WaitGroup
		start, last time.Time
		perr, cerr  error
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		if perr = rawPublish(ctx, pch, q, n, window, func() { start = time.Now() }); perr != nil {
			cancel()
		}
	}()
	go func() {
		defer wg.Done()
		if cerr = rawConsume(ctx, ds, n); cerr != nil {
			cancel()
			return
		}
		last = time.Now()
	}()
	wg.Wait()
	if perr != nil && cerr != nil {
		// One side failing cancels the other: report the cause.
		if isCtxErr(perr) && !isCtxErr(cerr) {
			return 0, cerr
		}
		return 0, perr
	}
	if err := errors.Join(perr, cerr); err != nil {
		return 0, err
	}
	e.measuredSince(start)
	return float64(n) / last.Sub(start).Seconds(), nil
}

func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
