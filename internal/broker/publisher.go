package broker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nudgehq/nudge/internal/redact"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Publish errors reported per message by PublishBatch.
var (
	// ErrNacked: the broker refused the message (for example the queue is at
	// its max-length and rejects publishes).
	ErrNacked = errors.New("broker nacked the message")
	// ErrUnroutable: the broker confirmed the message but no queue took it
	// (mandatory publish returned): a binding is missing.
	ErrUnroutable = errors.New("message was returned unroutable")
	// ErrNotConfirmed: the channel closed before the confirmation arrived;
	// the message may or may not be queued.
	ErrNotConfirmed = errors.New("message was not confirmed")
)

// Outgoing is one message to publish.
type Outgoing struct {
	Exchange   string
	RoutingKey string
	// Msg must have a MessageId unique within its batch: returns are matched by it.
	Msg amqp.Publishing
}

// Publisher publishes batches with publisher confirms and the mandatory flag
// on a connection of its own (so broker flow control on publishers never
// stalls a consumer). It redials lazily after a connection or channel loss,
// and on each new connection checks that the topology's exchanges exist (it
// never declares them).
// Safe for concurrent use; batches are published one at a time.
type Publisher struct {
	url  string
	topo Topology
	name string

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

// confirmWindow bounds the messages published before waiting for their
// confirmations. The returns buffer holds a whole window, so the library's
// reader goroutine never blocks handing us a return while we wait for acks.
const confirmWindow = 1000

// NewPublisher returns a publisher that dials url on first use. name shows
// in the broker's connection list.
func NewPublisher(url string, topo Topology, name string) *Publisher {
	return &Publisher{url: url, topo: topo.WithDefaults(), name: name}
}

// Dial opens an AMQP connection named for the broker's connection list.
// A URL that does not parse is reported in its redacted form: amqp091-go's
// own parse error quotes the whole URL, password included.
func Dial(url, name string) (*amqp.Connection, error) {
	if _, err := redact.Parse(url); err != nil {
		return nil, fmt.Errorf("connecting to RabbitMQ: %w", err)
	}
	if err := redact.Check(url, func(s string) error { _, err := amqp.ParseURI(s); return err }); err != nil {
		return nil, fmt.Errorf("connecting to RabbitMQ: %w", err)
	}
	cfg := amqp.Config{
		Heartbeat:  10 * time.Second,
		Properties: amqp.Table{"connection_name": name},
		Dial:       amqp.DefaultDial(10 * time.Second),
	}
	conn, err := amqp.DialConfig(url, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to RabbitMQ: %w", err)
	}
	return conn, nil
}

func (p *Publisher) ensure() error {
	if p.ch != nil && !p.ch.IsClosed() && !p.conn.IsClosed() {
		return nil
	}
	p.closeLocked()
	conn, err := Dial(p.url, p.name)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return fmt.Errorf("opening publish channel: %w", err)
	}
	// A missing exchange would only show as unconfirmed messages (the broker
	// closes the channel): name it instead.
	if err := Check(conn, Uses{Exchanges: []string{p.topo.WorkExchange(), p.topo.DeadExchange()}}); err != nil {
		conn.Close()
		return err
	}
	if err := ch.Confirm(false); err != nil {
		conn.Close()
		return fmt.Errorf("enabling publisher confirms: %w", err)
	}
	p.returns = ch.NotifyReturn(make(chan amqp.Return, confirmWindow+1))
	p.conn, p.ch = conn, ch
	return nil
}

func (p *Publisher) closeLocked() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.ch, p.returns = nil, nil, nil
}

// Close closes the connection.
func (p *Publisher) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLocked()
}

// PublishBatch publishes every message in windows of confirmWindow, waiting
// for each window's confirmations before the next. It returns one error per
// message (nil: confirmed and routed). The second return is set when nothing
// could be attempted (no connection); then every message is unsent.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []Outgoing) ([]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.ensure(); err != nil {
		return nil, err
	}
	results := make([]error, len(msgs))
	for start := 0; start < len(msgs); start += confirmWindow {
		end := min(start+confirmWindow, len(msgs))
		p.publishWindow(ctx, msgs[start:end], results[start:end])
	}
	return results, nil
}

func (p *Publisher) publishWindow(ctx context.Context, msgs []Outgoing, results []error) {
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		if p.ch == nil {
			results[i] = fmt.Errorf("%w: channel closed earlier in the batch", ErrNotConfirmed)
			continue
		}
		m.Msg.DeliveryMode = amqp.Persistent
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, m.Exchange, m.RoutingKey, true, false, m.Msg)
		if err == nil && dc == nil {
			err = errors.New("channel is not in confirm mode")
		}
		if err != nil {
			results[i] = fmt.Errorf("%w: publishing: %v", ErrNotConfirmed, err)
			p.closeLocked()
			continue
		}
		confirms[i] = dc
	}
	for i, dc := range confirms {
		if dc == nil {
			continue
		}
		ok, err := dc.WaitContext(ctx)
		switch {
		case err != nil:
			results[i] = fmt.Errorf("%w: %v", ErrNotConfirmed, err)
		case !ok && (p.ch == nil || p.ch.IsClosed()):
			results[i] = ErrNotConfirmed // pending confirmations resolve false on close
		case !ok:
			results[i] = ErrNacked
		}
	}
	// A basic.return precedes its basic.ack on the wire, and the library hands
	// both over from one reader goroutine: every return of this window is
	// already buffered in p.returns.
	var returned map[string]bool
	for draining := p.returns != nil; draining; {
		select {
		case r, ok := <-p.returns:
			if !ok {
				draining = false
				break
			}
			if returned == nil {
				returned = map[string]bool{}
			}
			returned[r.MessageId] = true
		default:
			draining = false
		}
	}
	for i, m := range msgs {
		if results[i] == nil && returned[m.Msg.MessageId] {
			results[i] = ErrUnroutable
		}
	}
}
