package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	// ErrNotConfirmed: the channel closed, or the publish timeout passed,
	// before the confirmation arrived; the message may or may not be queued.
	ErrNotConfirmed = errors.New("message was not confirmed")
	// ErrBlocked: the broker blocks this connection's publishers (a memory or
	// disk alarm; connection.blocked). PublishBatch fails at once with it,
	// every message unsent, instead of waiting for the alarm to clear.
	ErrBlocked = errors.New("the broker is blocking publishers")
)

// DefaultPublishTimeout is Publisher.Timeout's zero value.
const DefaultPublishTimeout = 30 * time.Second

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
// never declares them). No publish waits without bound: while the broker
// blocks the connection (a resource alarm) PublishBatch fails at once with
// ErrBlocked, and every batch is bounded by Timeout even when the caller's
// context has no deadline.
// Safe for concurrent use; batches are published one at a time.
type Publisher struct {
	url  string
	topo Topology
	name string
	// Timeout bounds one PublishBatch: publishing, waiting for the
	// confirmations, and a write stuck on a stalled connection (which is
	// then closed). Set it before the first publish. Zero value:
	// DefaultPublishTimeout.
	Timeout time.Duration

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	// blockings is the current connection's NotifyBlocked channel, drained
	// by watchBlocked into block (a test hook delivers into it too).
	blockings chan amqp.Blocking
	block     atomic.Pointer[blockState]
}

// blockState is whether one connection is blocked, and why.
type blockState struct {
	mu     sync.Mutex
	active bool
	reason string
}

func (b *blockState) set(active bool, reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.active, b.reason = active, reason
}

func (b *blockState) get() (bool, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.active, b.reason
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
	// Buffered and drained until the library closes it with the connection.
	p.blockings = conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	st := &blockState{}
	p.block.Store(st)
	go watchBlocked(p.blockings, st)
	p.conn, p.ch = conn, ch
	return nil
}

// watchBlocked records the broker's connection.blocked and
// connection.unblocked for one connection until it closes.
func watchBlocked(blockings <-chan amqp.Blocking, st *blockState) {
	for b := range blockings {
		st.set(b.Active, b.Reason)
	}
	st.set(false, "")
}

// Blocked reports whether the broker blocks this publisher's connection (a
// memory or disk alarm), and why. A process that publishes is not ready
// while it is.
func (p *Publisher) Blocked() (bool, string) {
	if st := p.block.Load(); st != nil {
		return st.get()
	}
	return false, ""
}

// Connect dials, if no connection is open, and checks the exchanges, as the
// first publish would: a process asks it before claiming work it could not
// publish.
func (p *Publisher) Connect() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ensure()
}

func (p *Publisher) closeLocked() {
	if p.conn != nil {
		// Bounded: a stalled broker never answers connection.close.
		_ = p.conn.CloseDeadline(time.Now().Add(time.Second))
	}
	p.conn, p.ch, p.returns, p.blockings = nil, nil, nil, nil
}

// Close closes the connection.
func (p *Publisher) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLocked()
}

// PublishBatch publishes every message in windows of confirmWindow, waiting
// for each window's confirmations before the next. It returns one error per
// message (nil: confirmed and routed; ErrNotConfirmed wrapping
// context.DeadlineExceeded when Timeout passed first). The second return is
// set when nothing could be attempted (no connection, or ErrBlocked); then
// every message is unsent.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []Outgoing) ([]error, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(p.Timeout, DefaultPublishTimeout))
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.ensure(); err != nil {
		return nil, err
	}
	if blocked, reason := p.Blocked(); blocked {
		return nil, fmt.Errorf("%w (%s)", ErrBlocked, reason)
	}
	// A write stuck on a connection the broker stopped reading ends when
	// the connection closes; the confirmations are then lost anyway.
	conn := p.conn
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now()) })
	defer stop()
	results := make([]error, len(msgs))
	for start := 0; start < len(msgs); start += confirmWindow {
		end := min(start+confirmWindow, len(msgs))
		p.publishWindow(ctx, msgs[start:end], results[start:end])
	}
	if ctx.Err() != nil {
		p.closeLocked() // confirmations still due would match later publishes
	}
	return results, nil
}

func (p *Publisher) publishWindow(ctx context.Context, msgs []Outgoing, results []error) {
	// notConfirmed is ErrNotConfirmed for why, wrapping the publish
	// timeout's context.DeadlineExceeded when that is what closed the
	// connection: a stalled broker and a closed channel race to report the
	// same loss, and the caller learns which it was either way.
	notConfirmed := func(why string) error {
		if cerr := ctx.Err(); cerr != nil {
			return fmt.Errorf("%w: %s: %w", ErrNotConfirmed, why, cerr)
		}
		return fmt.Errorf("%w: %s", ErrNotConfirmed, why)
	}
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		if p.ch == nil {
			results[i] = notConfirmed("channel closed earlier in the batch")
			continue
		}
		m.Msg.DeliveryMode = amqp.Persistent
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, m.Exchange, m.RoutingKey, true, false, m.Msg)
		if err == nil && dc == nil {
			err = errors.New("channel is not in confirm mode")
		}
		if err != nil {
			results[i] = notConfirmed("publishing: " + err.Error())
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
			results[i] = fmt.Errorf("%w: %w", ErrNotConfirmed, err)
		case !ok && (p.ch == nil || p.ch.IsClosed()):
			results[i] = notConfirmed("the channel closed") // pending confirmations resolve false on close
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
