package broker_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/testenv"
)

// work returns n messages for the topology's email work queue.
func work(topo broker.Topology, n int) []broker.Outgoing {
	out := make([]broker.Outgoing, n)
	for i := range out {
		out[i] = broker.Outgoing{Exchange: topo.WorkExchange(), RoutingKey: "email",
			Msg: amqp.Publishing{MessageId: strconv.Itoa(i) + "-1", Body: []byte("{}")}}
	}
	return out
}

// Issue 13, finding 7: during a broker resource alarm the publisher waited
// without a deadline while the process reported ready. Now a blocked
// connection shows in Blocked and fails PublishBatch at once, every message
// unsent; once unblocked, publishing resumes on the same connection.
func TestPublisherFailsFastWhileTheBrokerBlocksIt(t *testing.T) {
	t.Parallel()
	mq := testenv.RabbitMQ(t)
	topo := mq.Topology.WithDefaults()
	pub := broker.NewPublisher(mq.URL, topo, "broker-test-blocked")
	defer pub.Close()
	require.NoError(t, pub.Connect())
	blocked, _ := pub.Blocked()
	require.False(t, blocked)

	pub.DeliverBlocking(amqp.Blocking{Active: true, Reason: "low on memory"})
	require.Eventually(t, func() bool { b, _ := pub.Blocked(); return b }, 5*time.Second, time.Millisecond)
	_, reason := pub.Blocked()
	require.Equal(t, "low on memory", reason)
	results, err := pub.PublishBatch(context.Background(), work(topo, 3))
	require.ErrorIs(t, err, broker.ErrBlocked)
	require.Contains(t, err.Error(), "low on memory")
	require.Nil(t, results, "nothing was attempted")

	pub.DeliverBlocking(amqp.Blocking{Active: false})
	require.Eventually(t, func() bool { b, _ := pub.Blocked(); return !b }, 5*time.Second, time.Millisecond)
	results, err = pub.PublishBatch(context.Background(), work(topo, 3))
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil, nil}, results)
}

// Issue 13, finding 7: a publish on a connection the broker stopped reading
// (an alarm, a network partition) waited forever when the caller's context
// had no deadline. Now Timeout bounds it: every message comes back
// unconfirmed with context.DeadlineExceeded, and the next batch redials.
func TestPublishIsBoundedOnAStalledConnection(t *testing.T) {
	t.Parallel()
	mq := testenv.RabbitMQ(t)
	topo := mq.Topology.WithDefaults()
	proxy := newStallProxy(t, mq.URL)
	pub := broker.NewPublisher(proxy.url, topo, "broker-test-stalled")
	pub.Timeout = 500 * time.Millisecond
	defer pub.Close()
	results, err := pub.PublishBatch(context.Background(), work(topo, 2))
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil}, results)

	proxy.stall()
	start := time.Now()
	results, err = pub.PublishBatch(context.Background(), work(topo, 2))
	require.NoError(t, err, "the connection was up: the messages were attempted")
	require.Less(t, time.Since(start), 5*time.Second, "bounded by the publish timeout")
	for _, r := range results {
		require.ErrorIs(t, r, broker.ErrNotConfirmed)
		require.ErrorIs(t, r, context.DeadlineExceeded)
	}

	proxy.resume()
	results, err = pub.PublishBatch(context.Background(), work(topo, 2))
	require.NoError(t, err)
	require.Equal(t, []error{nil, nil}, results, "a new connection after the stalled one was dropped")
}

// stallProxy forwards TCP connections to the broker until stall, after which
// it forwards nothing (in either direction) until resume: to the publisher,
// the broker has stopped reading.
type stallProxy struct {
	url string
	mu  sync.Mutex
	// gate is closed while forwarding; stall replaces it with an open one.
	gate  chan struct{}
	conns []net.Conn
}

func newStallProxy(t *testing.T, amqpURL string) *stallProxy {
	t.Helper()
	u, err := url.Parse(amqpURL)
	require.NoError(t, err)
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u.Host = ln.Addr().String()
	p := &stallProxy{url: u.String(), gate: make(chan struct{})}
	close(p.gate)
	t.Cleanup(func() {
		ln.Close()
		p.resume()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			go p.pump(client, server)
			go p.pump(server, client)
		}
	}()
	return p
}

func (p *stallProxy) pump(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		gate := p.gate
		p.mu.Unlock()
		<-gate
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				src.Close()
			}
			return
		}
	}
}

func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gate = make(chan struct{})
}

func (p *stallProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}
