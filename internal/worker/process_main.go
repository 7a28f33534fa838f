package worker

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/store"
)

// Process is what a worker binary's flags fill in: the connections, the
// worker's tuning, where to serve probes and the limits file. Both worker
// binaries run through it, so they differ only in their provider adapter.
type Process struct {
	Common config.Common
	Config Config
	Listen string
	Limits string
}

// RegisterFlags adds every flag a worker binary shares.
func (p *Process) RegisterFlags(fs *pflag.FlagSet) {
	p.Common.RegisterDB(fs)
	p.Common.RegisterBroker(fs)
	RegisterFlags(fs, &p.Config)
	fs.StringVar(&p.Listen, "listen", config.DefaultProbeListen, "address for /healthz, /readyz and /metrics (empty: none)")
	fs.StringVar(&p.Limits, "limits", "", "fleet-wide rate limits file (JSON, docs/rate-limits.md; empty: none)")
}

// Run connects, loads the limits, serves the probes and consumes until
// SIGINT or SIGTERM, then drains. component names the process in logs and
// in the event trail; newSender builds the provider adapter once the
// configuration is known to be valid.
func (p *Process) Run(component string, newSender func() (provider.Sender, func(), error)) error {
	log, err := p.Common.Logger(component)
	if err != nil {
		return err
	}
	keys, err := p.Common.Keys()
	if err != nil {
		return err
	}
	lim, err := ratelimit.Load(p.Limits)
	if err != nil {
		return fmt.Errorf("--limits: %w", err)
	}
	sender, closeSender, err := newSender()
	if err != nil {
		return err
	}
	defer closeSender()
	ctx, stop := config.SignalContext()
	defer stop()
	pool, err := p.Common.Pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := probe.NewRegistry()
	version := ratelimit.ExportVersion(reg, lim)
	log.Info().Str("version", lim.Version).Str("file", p.Limits).Msg("rate limits active")
	limiter := ratelimit.New(pool, lim)
	if p.Limits != "" {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP) // kill -HUP: read the limits file again
		defer signal.Stop(hup)
		go ratelimit.Reload(ctx, hup, p.Limits, limiter, version, log)
	}
	cfg := p.Config
	cfg.Name = config.Actor(component)
	w, err := New(cfg, Deps{
		AMQPURL: p.Common.AMQPURL, Topology: p.Common.Topology(), Store: store.New(pool), Sender: sender,
		Keys: keys, Clock: clock.Real{}, Log: log, Metrics: metrics.New(reg), Limiter: limiter,
		DeclareTopology: p.Common.DeclareTopology,
	})
	if err != nil {
		return err
	}
	return w.Serve(ctx, p.Listen, reg)
}
