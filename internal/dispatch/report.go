package dispatch

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/internal/pg"
)

// Report returns an AfterRun hook that records runs in dispatch_runs (the
// heartbeat behind "is the dispatcher advancing its cutoff") and, with a
// Pushgateway address, pushes each summary and its hop latencies there: a
// CronJob's process is gone before any scrape could reach it. In an --every
// loop, idle runs are recorded at most once a minute (a CronJob's cadence),
// so a one-second loop does not write 86,400 heartbeat rows a day.
func Report(db pg.Querier, actor, pushgateway string, reg prometheus.Gatherer, log zerolog.Logger) func(context.Context, Summary, error) {
	var lastRecorded time.Time
	return func(ctx context.Context, sum Summary, runErr error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		finished := time.Now()
		idle := sum.Claimed == 0 && runErr == nil && !sum.OutOfBudget
		if idle && finished.Sub(lastRecorded) < time.Minute {
			return
		}
		lastRecorded = finished
		if err := ops.RecordDispatchRun(ctx, db, ops.DispatchRun{Actor: actor, Cutoff: sum.Cutoff, FinishedAt: finished,
			Claimed: sum.Claimed, Enqueued: sum.Enqueued, Expired: sum.Expired, Released: sum.Released,
			OutOfBudget: sum.OutOfBudget, Err: runErr}); err != nil {
			log.Warn().Err(err).Msg("recording the dispatch run")
		}
		if err := metrics.PushDispatchRun(ctx, pushgateway, metrics.DispatchRun{Cutoff: sum.Cutoff, Finished: finished,
			Elapsed: sum.Elapsed, Batches: sum.Batches, Claimed: sum.Claimed, Enqueued: sum.Enqueued, Expired: sum.Expired,
			Released: sum.Released, OutOfBudget: sum.OutOfBudget, Err: runErr}, reg); err != nil {
			log.Warn().Err(err).Msg("pushing the run's metrics")
		}
	}
}
