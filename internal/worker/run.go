package worker

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/probe"
)

// RegisterFlags adds the flags that tune a worker to fs, with the defaults
// a production Deployment starts from.
func RegisterFlags(fs *pflag.FlagSet, c *Config) {
	fs.IntVar(&c.Concurrency, "concurrency", 4, "batches processed at once")
	fs.IntVar(&c.Batch, "batch", 50, "deliveries processed together (one read, one claim, one outcome write)")
	fs.DurationVar(&c.BatchWait, "batch-wait", 10*time.Millisecond, "how long a partial batch waits for more deliveries")
	fs.IntVar(&c.Prefetch, "prefetch", 0, "unacked deliveries the broker may send ahead (0: concurrency × batch × 2)")
	fs.DurationVar(&c.SendTimeout, "send-timeout", 30*time.Second, "bound on one provider call")
	fs.DurationVar(&c.SendLease, "send-lease", 0,
		"how long a claimed attempt is protected before the reconciler may retry it (0: send-timeout + 30s)")
	fs.IntVar(&c.MaxAttempts, "max-attempts", 5, "send attempts per reminder before it fails")
	fs.DurationVar(&c.BackoffBase, "backoff-base", time.Second, "first retry delay (doubles per attempt, with jitter, rounded up to a retry tier)")
	fs.DurationVar(&c.BackoffMax, "backoff-max", time.Hour, "longest retry delay")
	fs.DurationVar(&c.Grace, "grace", 25*time.Second,
		"on SIGTERM, time to finish and ack in-flight work; keep below terminationGracePeriodSeconds")
	fs.Float64Var(&c.Rate, "rate", 0, "sends per second in this process (0: unlimited)")
	fs.IntVar(&c.Burst, "burst", 0, "rate limiter burst (0: the rate rounded up)")
}

// Serve runs the worker with its probe server on listen until ctx is done.
func (w *Worker) Serve(ctx context.Context, listen string, reg *prometheus.Registry) error {
	if err := probe.Serve(ctx, listen, reg, w.Ready, w.log); err != nil {
		return err
	}
	err := w.Run(ctx)
	c := w.Counts()
	w.log.Info().Int64("delivered", c.Delivered).Int64("retried", c.Retried).Int64("failed", c.Failed).
		Int64("expired", c.Expired).Int64("duplicates", c.Duplicates).Int64("superseded", c.Superseded).
		Int64("dead_lettered", c.DeadLettered).Int64("stale", c.Stale).Int64("quarantined", c.Quarantined).
		Int64("deferred", c.Deferred).Int64("slots_missed", c.SlotsMissed).
		Msg("worker stopped")
	return err
}
