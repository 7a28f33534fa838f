package broker

import amqp "github.com/rabbitmq/amqp091-go"

// DeliverBlocking hands b to the publisher's current connection as the
// library does when the broker sends connection.blocked or unblocked: a test
// cannot raise a real resource alarm without blocking every other publisher
// on the shared broker. The publisher must be connected (Connect).
func (p *Publisher) DeliverBlocking(b amqp.Blocking) {
	p.mu.Lock()
	ch := p.blockings
	p.mu.Unlock()
	ch <- b
}
