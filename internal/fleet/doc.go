// Package fleet is where the processes that move reminders start: the
// dispatcher, the email and SMS workers and the reconciler. Each has an
// options type that its binary's flags fill in (RegisterFlags, with every
// default taken from the library it configures, so a default is written once)
// and a Run that connects to PostgreSQL and RabbitMQ, checks the broker
// topology, builds the component from internal/dispatch, internal/worker or
// internal/reconcile, and runs it until its context ends.
//
// A binary's main.go only wires what is the process's own (its flags, its
// logger, its metrics registry, its clock and a context canceled by SIGINT or
// SIGTERM, together an Env) and calls Run, so the start-up of every process
// lives here, in one place, rather than beside the code each one runs.
// nudgectl, the operator's tool, is not part of the fleet (internal/ctl).
package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/store"
)

// DefaultListen is where a long-running process serves /healthz, /readyz and
// /metrics unless --listen says otherwise.
// Loopback by default (issue 13): a deployment that needs the kubelet or
// Prometheus to reach it sets --listen=:8080 explicitly, as deploy/k8s does.
const DefaultListen = config.DefaultProbeListen

// Env is what a binary's main wires before it calls Run.
type Env struct {
	// Log is the process logger, tagged with its component.
	Log zerolog.Logger
	// Registry receives the process's metrics; the probe server serves it
	// (the dispatcher pushes it to a Pushgateway instead). Required.
	Registry *prometheus.Registry
	// Clock is the time every decision takes (clock.Real in production).
	Clock clock.Clock
}

// publishing is what the dispatcher and the reconciler share: the pool and
// an Enqueuer publishing as the component.
type publishing struct {
	pool     *pgxpool.Pool
	enqueuer dispatch.Enqueuer
	close    func()
}

// startPublishing connects for component and checks (or, with
// --declare-topology, declares) the broker topology, so a missing queue
// stops the process before it claims anything. A broker it cannot reach
// does not stop it: the database's work (expiry, leases, retention) goes
// on, and the topology is checked again before anything is claimed for
// publishing (Enqueuer.BrokerReady).
func startPublishing(ctx context.Context, c *config.Common, component string, timeouts config.DBTimeouts, env Env) (*publishing, error) {
	keys, err := c.Keys()
	if err != nil {
		return nil, err
	}
	pool, err := c.PoolWith(ctx, timeouts)
	if err != nil {
		return nil, err
	}
	actor := config.Actor(component)
	pub := broker.NewPublisher(c.AMQPURL, c.Topology(), actor)
	pub.Timeout = c.PublishTimeout
	gate := &brokerGate{common: c, actor: actor, pub: pub}
	if err := gate.check(); err != nil {
		if errors.Is(err, broker.ErrTopologyMissing) {
			pool.Close()
			return nil, err
		}
		env.Log.Warn().Err(err).Msg("broker unreachable at start: going on with the database's work; nothing is claimed for publishing until it is back")
	}
	return &publishing{
		pool: pool,
		enqueuer: dispatch.Enqueuer{
			Store: store.New(pool), Publisher: pub, Keys: keys, Topology: c.Topology(),
			Clock: env.Clock, Actor: actor, Metrics: metrics.NewFor(env.Registry, metrics.Component(component), c.Topology().WithDefaults().Channels...), BrokerReady: gate.ready,
		},
		close: func() { pub.Close(); pool.Close() },
	}, nil
}

// brokerGate says whether the dispatcher or the reconciler can publish now:
// the topology checked once (at start, or at the first call after the
// broker came back), a publishing connection open, and no resource alarm.
type brokerGate struct {
	common  *config.Common
	actor   string
	pub     *broker.Publisher
	checked atomic.Bool
}

// check checks (or declares) the topology the publisher uses, once.
func (g *brokerGate) check() error {
	if g.checked.Load() {
		return nil
	}
	// Both publish to the work exchange, which must route to every work queue.
	if err := g.common.PrepareTopology(g.actor, broker.Topology.PublisherUses); err != nil {
		return err
	}
	g.checked.Store(true)
	return nil
}

func (g *brokerGate) ready(context.Context) error {
	if err := g.check(); err != nil {
		return err
	}
	if err := g.pub.Connect(); err != nil {
		return err
	}
	if blocked, reason := g.pub.Blocked(); blocked {
		return fmt.Errorf("%w (%s)", broker.ErrBlocked, reason)
	}
	return nil
}
