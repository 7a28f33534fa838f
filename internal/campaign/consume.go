package campaign

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/broker"
)

// Consume takes planning commands from the planning queue, one at a time
// (prefetch 1: a command holds a campaign for a whole slice), until ctx ends
// or the connection is lost. A command is acknowledged only after its
// slice's transaction committed and its continuation was confirmed; a
// command that cannot be verified is dead-lettered (rejected without
// requeue, to P.plan.dead); any other failure gives it back for redelivery,
// which the queue's delivery limit bounds. When ctx ends, the command in
// hand is finished first (a soft stop). A lost connection ends Consume
// with an error: the process exits and its Deployment restarts it, which is
// the whole recovery a planner needs (the checkpoint is in the database).
func (p *Planner) Consume(ctx context.Context, amqpURL string) error {
	conn, err := broker.Dial(amqpURL, p.Name)
	if err != nil {
		return fmt.Errorf("planner: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("planner: opening a channel: %w", err)
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return fmt.Errorf("planner: setting prefetch: %w", err)
	}
	q := p.Topology.Queue(Channel)
	deliveries, err := ch.Consume(q, p.Name, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("planner: consuming %s: %w", q, err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	p.Log.Info().Str("queue", q).Msg("planner consuming")
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-closed:
			return fmt.Errorf("planner: connection closed: %v", e)
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("planner: delivery channel closed")
			}
			// A slice started is finished, not abandoned on SIGTERM: it
			// is bounded by the campaign's lease and the publish timeout.
			if err := p.settle(context.WithoutCancel(ctx), d); err != nil {
				return err
			}
		}
	}
}

func (p *Planner) settle(ctx context.Context, d amqp.Delivery) error {
	start := p.Clock.Now()
	dec, err := p.Handle(ctx, d.Body, d.Headers)
	p.observe(dec, err, p.Clock.Now().Sub(start))
	switch {
	case err == nil:
		return ack(d.Ack(false))
	case errors.Is(err, ErrPoison):
		p.Log.Error().Err(err).Msg("dead-lettering a planning command")
		return ack(d.Reject(false))
	default:
		p.Log.Warn().Err(err).Stringer("verdict", dec.Verdict).Msg("planning command given back")
		return ack(d.Nack(false, true))
	}
}

func ack(err error) error {
	if err != nil {
		return fmt.Errorf("planner: settling a delivery: %w", err)
	}
	return nil
}
