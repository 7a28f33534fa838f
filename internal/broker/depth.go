package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// QueueState is what a passive declare tells of a queue: its ready messages
// (those delivered and not yet acknowledged do not count) and its consumers.
type QueueState struct {
	Messages  int
	Consumers int
}

// inspector reads queue states by passive declares over one connection it
// keeps and redials after a failure.
type inspector struct {
	mu   sync.Mutex
	conn *amqp.Connection
}

// states returns the state of each queue of names that exists, by name; a
// queue never declared is absent.
func (in *inspector) states(ctx context.Context, url, connName string, names []string) (map[string]QueueState, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if in.conn == nil || in.conn.IsClosed() {
		conn, err := Dial(url, connName)
		if err != nil {
			return nil, err
		}
		in.conn = conn
	}
	out := map[string]QueueState{}
	for _, name := range names {
		ch, err := in.conn.Channel()
		if err != nil {
			_ = in.conn.Close()
			in.conn = nil
			return nil, fmt.Errorf("opening a channel: %w", err)
		}
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		var ae *amqp.Error
		switch {
		case err == nil:
			out[name] = QueueState{Messages: q.Messages, Consumers: q.Consumers}
			_ = ch.Close()
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			// the failed passive declare closed the channel
		default:
			return nil, fmt.Errorf("inspecting %s: %w", name, err)
		}
	}
	return out, nil
}

func (in *inspector) close() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.conn != nil {
		_ = in.conn.Close()
		in.conn = nil
	}
}

// byChannel reads the queue queue(c) of every channel of topo, by channel.
func (in *inspector) byChannel(ctx context.Context, url, connName string, topo Topology, queue func(string) string) (map[string]QueueState, error) {
	topo = topo.WithDefaults()
	names := make([]string, len(topo.Channels))
	for i, c := range topo.Channels {
		names[i] = queue(c)
	}
	st, err := in.states(ctx, url, connName, names)
	if err != nil {
		return nil, err
	}
	out := make(map[string]QueueState, len(names))
	for i, c := range topo.Channels {
		out[c] = st[names[i]]
	}
	return out, nil
}

// DeadLetterDepths reads each channel's dead-letter queue depth over one
// connection it keeps and redials after a failure: the reconciler's metrics
// collector asks at every scrape, nudgectl stats once. Only ready messages
// count: those an operator's read holds unacknowledged do not.
type DeadLetterDepths struct {
	URL      string
	Topology Topology

	in inspector
}

// Depths returns each channel's dead-letter queue depth (0 for a queue never
// declared: nothing was ever dead-lettered there).
func (r *DeadLetterDepths) Depths(ctx context.Context) (map[string]int, error) {
	topo := r.Topology.WithDefaults()
	st, err := r.in.byChannel(ctx, r.URL, "nudge-dlq-depth", topo, topo.DeadQueue)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(st))
	for c, s := range st {
		out[c] = s.Messages
	}
	return out, nil
}

// Close closes the connection.
func (r *DeadLetterDepths) Close() { r.in.close() }

// WorkQueues reads each channel's work queue (its ready messages and its
// consumers) over one connection it keeps and redials after a failure. The
// reconciler asks before republishing: a message overdue in a queue with a
// backlog or no consumer is waiting, not lost.
type WorkQueues struct {
	URL      string
	Topology Topology

	in inspector
}

// States returns each channel's work queue state (zero for a queue never
// declared).
func (w *WorkQueues) States(ctx context.Context) (map[string]QueueState, error) {
	topo := w.Topology.WithDefaults()
	return w.in.byChannel(ctx, w.URL, "nudge-work-queues", topo, topo.Queue)
}

// Close closes the connection.
func (w *WorkQueues) Close() { w.in.close() }
