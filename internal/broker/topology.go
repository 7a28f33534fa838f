// Package broker owns Nudge's use of RabbitMQ: the topology, declared once by
// a privileged step and checked passively by every binary (check.go says
// why), and a publisher that only reports a message sent once the broker has
// confirmed and routed it.
//
// The topology per channel C (with prefix P, default "nudge"):
//
//	P.work      direct exchange; routing key C → queue P.C
//	P.C         quorum work queue: x-delivery-limit, dead-letters at least once to P.dead
//	P.dead      direct exchange; routing key C → queue P.C.dead
//	P.C.dead    quorum dead-letter queue, inspected and replayed by operators;
//	            bounded, dropping its oldest message when full (DeadMaxLength)
//	P.C.retry.D quorum retry tier with x-message-ttl D, dead-lettering back to
//	            P.work with routing key C (one queue per delay: expiry only
//	            happens at the head, so one TTL per queue keeps tiers honest)
//	P.C.retry   direct exchange; routing key P.C.retry.D → queue P.C.retry.D.
//	            The worker of C publishes its retries here, and may write to
//	            no other exchange but P.dead: never the default exchange,
//	            which reaches every queue by name, other channels' included
//
// Campaign planning commands (internal/campaign) have a topology of their own
// under the same prefix, Planning: the work exchange routes "plan" to P.plan,
// with P.plan.dead and one retry tier, declared beside the channels' by the
// migration step, so the channels' consumers, publishers and checks are
// untouched by it.
//
// Declarations are idempotent; a queue declared earlier with other arguments
// makes the declaration fail loudly (406) rather than run with a drifted shape.
package broker

import (
	"cmp"
	"errors"
	"fmt"
	"sort"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/pkg/reminder"
)

// Topology names and shapes the exchanges and queues.
type Topology struct {
	// Prefix starts every exchange and queue name. Zero value: "nudge".
	Prefix string
	// Channels are the routing keys with a work queue each. Zero value:
	// every channel of reminder.Channels (email, sms, webhook).
	Channels []string
	// DeliveryLimit is x-delivery-limit on work queues: a message delivered
	// more than this many times (crash loops, channel closes) is dead-lettered
	// with reason delivery_limit. Zero value: 10.
	DeliveryLimit int
	// MaxLength bounds each queue; publishes beyond it are refused
	// (reject-publish), which at-least-once dead-lettering requires. Zero value: 10,000,000.
	MaxLength int
	// RetryTiers are the retry delays, one queue each. Zero value: DefaultRetryTiers.
	RetryTiers []time.Duration
	// DeadMaxLength and DeadMaxBytes bound each dead-letter queue: at most
	// this many messages, and this many bytes of message bodies. A full
	// dead-letter queue drops its oldest message (x-overflow drop-head)
	// rather than refuse a new one: refused, the worker's dead-letter
	// publish would fail, it would reject the message into the work queue's
	// own at-least-once dead-lettering, and the work queue would hold it,
	// retrying, until it too filled and stopped the dispatcher. A dropped
	// dead letter loses only the message: the reminder it named stays
	// quarantined in the reminders table, the record, where `nudgectl
	// replay --state quarantined` finds it (docs/operations.md). Zero
	// values: DefaultDeadMaxLength, DefaultDeadMaxBytes.
	DeadMaxLength int
	DeadMaxBytes  int
}

// Bounds of a dead-letter queue (Topology.DeadMaxLength, DeadMaxBytes):
// room for every quarantine of a bad day, and at most what an operator's
// nudgectl holds in memory while it reads the queue.
const (
	DefaultDeadMaxLength = 100_000
	DefaultDeadMaxBytes  = 64 << 20
)

// DefaultRetryTiers are the delays of the retry queues.
// The sub-second ones serve rate-limit deferrals, which wait for a token
// that is a fraction of a second away.
var DefaultRetryTiers = []time.Duration{
	250 * time.Millisecond, time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 10 * time.Minute, time.Hour,
}

// DefaultPrefix is the Prefix of a Topology that names none.
const DefaultPrefix = "nudge"

// WithDefaults returns t with zero fields filled.
func (t Topology) WithDefaults() Topology {
	if t.Prefix == "" {
		t.Prefix = DefaultPrefix
	}
	if len(t.Channels) == 0 {
		for _, c := range reminder.Channels {
			t.Channels = append(t.Channels, string(c))
		}
	}
	if t.DeliveryLimit == 0 {
		t.DeliveryLimit = 10
	}
	if t.MaxLength == 0 {
		t.MaxLength = 10_000_000
	}
	if len(t.RetryTiers) == 0 {
		t.RetryTiers = DefaultRetryTiers
	}
	t.DeadMaxLength = cmp.Or(t.DeadMaxLength, DefaultDeadMaxLength)
	t.DeadMaxBytes = cmp.Or(t.DeadMaxBytes, DefaultDeadMaxBytes)
	tiers := append([]time.Duration(nil), t.RetryTiers...)
	sort.Slice(tiers, func(i, j int) bool { return tiers[i] < tiers[j] })
	t.RetryTiers = tiers
	return t
}

// PlanChannel is the pseudo-channel of campaign planning commands: the
// routing key and queue of Planning, and the channel their signing key is
// derived for (message.ChannelKey), so no channel worker's key signs them.
const PlanChannel = "plan"

// PlanRetryTier is the one retry tier of the planning queue.
const PlanRetryTier = 5 * time.Second

// Planning is the planning queue's topology under t's prefix, with t's
// bounds: the channel PlanChannel and the one retry tier PlanRetryTier.
func (t Topology) Planning() Topology {
	p := t
	p.Channels = []string{PlanChannel}
	p.RetryTiers = []time.Duration{PlanRetryTier}
	return p.WithDefaults()
}

// WorkExchange is the exchange the dispatcher publishes to.
func (t Topology) WorkExchange() string { return t.Prefix + ".work" }

// DeadExchange receives dead letters.
func (t Topology) DeadExchange() string { return t.Prefix + ".dead" }

// Queue is the work queue of a channel.
func (t Topology) Queue(channel string) string { return t.Prefix + "." + channel }

// DeadQueue is the dead-letter queue of a channel.
func (t Topology) DeadQueue(channel string) string { return t.Prefix + "." + channel + ".dead" }

// RetryExchange is the exchange a channel's worker publishes retries to,
// with the retry tier's queue name as the routing key.
func (t Topology) RetryExchange(channel string) string { return t.Prefix + "." + channel + ".retry" }

// Exchanges lists every exchange name.
func (t Topology) Exchanges() []string {
	out := []string{t.WorkExchange(), t.DeadExchange()}
	for _, c := range t.Channels {
		out = append(out, t.RetryExchange(c))
	}
	return out
}

// RetryQueue is the retry tier of a channel with the given delay.
func (t Topology) RetryQueue(channel string, delay time.Duration) string {
	return fmt.Sprintf("%s.%s.retry.%s", t.Prefix, channel, delay)
}

// Tier returns the shortest retry tier at least as long as want, or the
// longest tier when want exceeds them all.
func (t Topology) Tier(want time.Duration) time.Duration {
	for _, d := range t.RetryTiers {
		if d >= want {
			return d
		}
	}
	return t.RetryTiers[len(t.RetryTiers)-1]
}

// TierAtMost returns the longest retry tier not longer than want, or 0 when
// even the shortest is longer: a message waiting in hops of these tiers comes
// back at or before its time, never after it.
func (t Topology) TierAtMost(want time.Duration) time.Duration {
	var best time.Duration
	for _, d := range t.RetryTiers {
		if d <= want {
			best = max(best, d)
		}
	}
	return best
}

// Queues lists every queue name, for cleanup and inspection.
func (t Topology) Queues() []string {
	var out []string
	for _, c := range t.Channels {
		out = append(out, t.Queue(c), t.DeadQueue(c))
		for _, d := range t.RetryTiers {
			out = append(out, t.RetryQueue(c, d))
		}
	}
	return out
}

func (t Topology) quorumArgs() amqp.Table {
	return amqp.Table{
		"x-queue-type":           "quorum",
		"x-overflow":             "reject-publish",
		"x-max-length":           int64(t.MaxLength),
		"x-dead-letter-strategy": "at-least-once",
		"x-dead-letter-exchange": t.DeadExchange(),
	}
}

// deadArgs shape a dead-letter queue: bounded, dropping its oldest message
// when full (see DeadMaxLength), and with no dead-letter exchange of its own,
// so a dropped message is gone.
func (t Topology) deadArgs() amqp.Table {
	return amqp.Table{
		"x-queue-type":       "quorum",
		"x-max-length":       int64(t.DeadMaxLength),
		"x-max-length-bytes": int64(t.DeadMaxBytes),
		"x-overflow":         "drop-head",
	}
}

func isPreconditionFailed(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed
}

// Declare declares the whole topology on ch. It needs configure permission
// on every name, and, for a queue it creates, read on the queue and write on
// its dead-letter exchange; binding needs write on the queue and read on the
// exchange. Only the migration step (and development) calls it.
func (t Topology) Declare(ch *amqp.Channel) error {
	for _, ex := range t.Exchanges() {
		if err := ch.ExchangeDeclare(ex, amqp.ExchangeDirect, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declaring exchange %s: %w", ex, err)
		}
	}
	for _, c := range t.Channels {
		work := t.quorumArgs()
		work["x-delivery-limit"] = int64(t.DeliveryLimit)
		if err := declareBound(ch, t.Queue(c), work, t.WorkExchange(), c); err != nil {
			return err
		}
		if err := declareBound(ch, t.DeadQueue(c), t.deadArgs(), t.DeadExchange(), c); err != nil {
			if isPreconditionFailed(err) {
				return fmt.Errorf("%w: %s was declared by an earlier version without its bounds "+
					"(x-max-length, x-overflow): see docs/operations.md, \"Bounded dead-letter queues\"", err, t.DeadQueue(c))
			}
			return err
		}
		for _, d := range t.RetryTiers {
			retry := t.quorumArgs()
			retry["x-message-ttl"] = d.Milliseconds()
			retry["x-dead-letter-exchange"] = t.WorkExchange()
			retry["x-dead-letter-routing-key"] = c
			q := t.RetryQueue(c, d)
			if err := declareBound(ch, q, retry, t.RetryExchange(c), q); err != nil {
				return err
			}
		}
	}
	return nil
}

func declareBound(ch *amqp.Channel, queue string, args amqp.Table, exchange, key string) error {
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		return fmt.Errorf("declaring queue %s: %w", queue, err)
	}
	if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
		return fmt.Errorf("binding queue %s to %s/%s: %w", queue, exchange, key, err)
	}
	return nil
}

// Delete removes every queue and exchange of the topology (tests and demos).
func (t Topology) Delete(ch *amqp.Channel) error {
	for _, q := range t.Queues() {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("deleting queue %s: %w", q, err)
		}
	}
	for _, ex := range t.Exchanges() {
		if err := ch.ExchangeDelete(ex, false, false); err != nil {
			return fmt.Errorf("deleting exchange %s: %w", ex, err)
		}
	}
	return nil
}
