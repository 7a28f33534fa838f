package broker

import (
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Declaring the topology is a privileged step. RabbitMQ checks configure
// permission on every queue.declare and exchange.declare, even one that
// re-declares what exists, so a binary that declared at start would need the
// right to create and delete the queues it only consumes from or publishes
// to (and, for a queue with a dead-letter exchange, read on the queue and
// write on that exchange). The topology is therefore declared once, by the
// migration step (`nudgectl migrate --declare-topology`, or
// `nudgectl broker declare`) under a user allowed to; the fleet only checks,
// with passive declares, which need no permission at all, that what it uses
// exists, and stops with the names of what is missing.

// ErrTopologyMissing means an exchange or queue a component uses does not
// exist: the topology was never declared in this vhost, or was deleted.
// Errors wrapping it are *MissingError, naming what is missing.
var ErrTopologyMissing = errors.New("the broker topology is missing")

// DeclareHint says how to create the topology; MissingError ends with it.
const DeclareHint = "declare it with `nudgectl migrate --declare-topology` or `nudgectl broker declare`, " +
	"as a RabbitMQ user allowed to configure Nudge's names (docs/deploy.md), " +
	"or start this process with --declare-topology (development)"

// MissingError lists the exchanges and queues a check found missing.
type MissingError struct {
	Vhost   string
	Missing []string // "queue nudge.email", "exchange nudge.work", in the order checked
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("RabbitMQ vhost %q has no %s: %v; %s",
		e.Vhost, strings.Join(e.Missing, ", "), ErrTopologyMissing, DeclareHint)
}

// Is makes errors.Is(err, ErrTopologyMissing) hold.
func (e *MissingError) Is(target error) bool { return target == ErrTopologyMissing }

// Uses names the exchanges and queues a component relies on.
type Uses struct {
	Exchanges []string
	Queues    []string
}

// PublisherUses is what the dispatcher and the reconciler rely on: the work
// exchange they publish to, and every channel's work queue it routes to.
func (t Topology) PublisherUses() Uses {
	u := Uses{Exchanges: []string{t.WorkExchange()}}
	for _, c := range t.Channels {
		u.Queues = append(u.Queues, t.Queue(c))
	}
	return u
}

// WorkerUses is what a channel's worker relies on: its work queue, its retry
// exchange and the retry tiers bound to it (which dead-letter back to the
// work exchange), and the dead-letter exchange with its channel's
// dead-letter queue.
func (t Topology) WorkerUses(channel string) Uses {
	u := Uses{Exchanges: []string{t.WorkExchange(), t.DeadExchange(), t.RetryExchange(channel)}, Queues: []string{t.Queue(channel)}}
	for _, d := range t.RetryTiers {
		u.Queues = append(u.Queues, t.RetryQueue(channel, d))
	}
	u.Queues = append(u.Queues, t.DeadQueue(channel))
	return u
}

// AllUses is the whole topology.
func (t Topology) AllUses() Uses {
	return Uses{Exchanges: t.Exchanges(), Queues: t.Queues()}
}

// Check verifies with passive declares that everything u names exists, and
// returns a *MissingError naming every missing exchange and queue. A passive
// declare needs no permission. A failed one closes its channel, so the
// checks run on throwaway channels, never on one the caller uses.
func Check(conn *amqp.Connection, u Uses) error {
	type item struct{ kind, name string }
	var items []item
	for _, ex := range u.Exchanges {
		items = append(items, item{"exchange", ex})
	}
	for _, q := range u.Queues {
		items = append(items, item{"queue", q})
	}
	var (
		ch      *amqp.Channel
		missing []string
	)
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for _, it := range items {
		if ch == nil {
			var err error
			if ch, err = conn.Channel(); err != nil {
				return fmt.Errorf("opening a channel to check the broker topology: %w", err)
			}
		}
		err := passive(ch, it.kind, it.name)
		var ae *amqp.Error
		switch {
		case err == nil:
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			missing = append(missing, it.kind+" "+it.name)
			ch = nil // the broker closed it
		default:
			return fmt.Errorf("checking %s %s: %w", it.kind, it.name, err)
		}
	}
	if len(missing) > 0 {
		return &MissingError{Vhost: conn.Config.Vhost, Missing: missing}
	}
	return nil
}

func passive(ch *amqp.Channel, kind, name string) error {
	if kind == "exchange" {
		return ch.ExchangeDeclarePassive(name, amqp.ExchangeDirect, true, false, false, false, nil)
	}
	_, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	return err
}

// Prepare readies conn's vhost for a component: with declare it declares
// the whole topology (which needs configure, and on first declaration read
// and write, permission on its names), otherwise it checks that what u
// names exists. Either runs on a channel of its own.
func (t Topology) Prepare(conn *amqp.Connection, declare bool, u Uses) error {
	if !declare {
		return Check(conn, u)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel to declare the broker topology: %w", err)
	}
	defer ch.Close()
	return t.Declare(ch)
}

// PrepareAt dials url, runs Prepare and closes the connection: the start-up
// step of a process that connects for real later (a publisher dials lazily).
// name shows in the broker's connection list.
func (t Topology) PrepareAt(url, name string, declare bool, u Uses) error {
	conn, err := Dial(url, name)
	if err != nil {
		return err
	}
	defer conn.Close()
	return t.Prepare(conn, declare, u)
}
