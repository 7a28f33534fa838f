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
// stops the process before it claims anything.
func startPublishing(ctx context.Context, c *config.Common, component string, env Env) (*publishing, error) {
	keys, err := c.Keys()
	if err != nil {
		return nil, err
	}
	pool, err := c.Pool(ctx)
	if err != nil {
		return nil, err
	}
	actor := config.Actor(component)
	// Both publish to the work exchange, which must route to every work queue.
	if err := c.PrepareTopology(actor, broker.Topology.PublisherUses); err != nil {
		pool.Close()
		return nil, err
	}
	pub := broker.NewPublisher(c.AMQPURL, c.Topology(), actor)
	return &publishing{
		pool: pool,
		enqueuer: dispatch.Enqueuer{
			Store: store.New(pool), Publisher: pub, Keys: keys, Topology: c.Topology(),
			Clock: env.Clock, Actor: actor, Metrics: metrics.New(env.Registry),
		},
		close: func() { pub.Close(); pool.Close() },
	}, nil
}
