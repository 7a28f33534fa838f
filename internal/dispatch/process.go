package dispatch

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/store"
)

// Process is what the dispatcher and the reconciler binaries share once
// their flags are parsed: a logger, a context canceled by SIGINT or SIGTERM,
// the database pool, and an Enqueuer publishing as the component.
type Process struct {
	Log      zerolog.Logger
	Ctx      context.Context
	Pool     *pgxpool.Pool
	Enqueuer Enqueuer
	closers  []func()
}

// Start connects for component and checks (or, with --declare-topology,
// declares) the broker topology, so a missing queue stops the process before
// it claims anything. m receives the Enqueuer's metrics (nil: none). Close
// releases everything.
func Start(common *config.Common, component string, m *metrics.Metrics) (*Process, error) {
	log, err := common.Logger(component)
	if err != nil {
		return nil, err
	}
	keys, err := common.Keys()
	if err != nil {
		return nil, err
	}
	ctx, stop := config.SignalContext()
	p := &Process{Log: log, Ctx: ctx, closers: []func(){stop}}
	p.Pool, err = common.Pool(ctx)
	if err != nil {
		p.Close()
		return nil, err
	}
	p.closers = append(p.closers, p.Pool.Close)
	actor := config.Actor(component)
	// Both publish to the work exchange, which must route to every work queue.
	if err := common.PrepareTopology(actor, broker.Topology.PublisherUses); err != nil {
		p.Close()
		return nil, err
	}
	pub := broker.NewPublisher(common.AMQPURL, common.Topology(), actor)
	p.closers = append(p.closers, pub.Close)
	p.Enqueuer = Enqueuer{
		Store: store.New(p.Pool), Publisher: pub, Keys: keys, Topology: common.Topology(),
		Clock: clock.Real{}, Actor: actor, Metrics: m,
	}
	return p, nil
}

// Close releases the publisher, the pool and the signal handler.
func (p *Process) Close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}
