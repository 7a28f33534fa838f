package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DeadLetterDepths reads each channel's dead-letter queue depth over one
// connection it keeps and redials after a failure: the reconciler's metrics
// collector asks at every scrape, nudgectl stats once. Only ready messages
// count: those an operator's read holds unacknowledged do not.
type DeadLetterDepths struct {
	URL      string
	Topology Topology

	mu   sync.Mutex
	conn *amqp.Connection
}

// Depths returns each channel's dead-letter queue depth (0 for a queue never
// declared: nothing was ever dead-lettered there).
func (r *DeadLetterDepths) Depths(ctx context.Context) (map[string]int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if r.conn == nil || r.conn.IsClosed() {
		conn, err := Dial(r.URL, "nudge-dlq-depth")
		if err != nil {
			return nil, err
		}
		r.conn = conn
	}
	topo := r.Topology.WithDefaults()
	out := map[string]int{}
	for _, c := range topo.Channels {
		name := topo.DeadQueue(c)
		ch, err := r.conn.Channel()
		if err != nil {
			_ = r.conn.Close()
			r.conn = nil
			return nil, fmt.Errorf("opening a channel: %w", err)
		}
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		var ae *amqp.Error
		switch {
		case err == nil:
			out[c] = q.Messages
			_ = ch.Close()
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			out[c] = 0 // the failed passive declare closed the channel
		default:
			return nil, fmt.Errorf("inspecting %s: %w", name, err)
		}
	}
	return out, nil
}

// Close closes the connection.
func (r *DeadLetterDepths) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil {
		_ = r.conn.Close()
		r.conn = nil
	}
}
