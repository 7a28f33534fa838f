package dispatch

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/sqlfile"
)

//go:embed queries.sql
var queriesSQL string

var queries = sqlfile.Parse("queries.sql", queriesSQL)

// RecordRun writes the dispatcher's heartbeat, one row in dispatch_runs for
// a run that finished at finished with runErr (nil: it succeeded): call it
// once at the end of every run, failed ones included. nudgectl stats and the
// metrics collector derive the cutoff lag from it.
//
// sum.Hops, when set, are the hop latencies the run observed: the
// reconciler exports them (metrics.DispatchRunCollector). The promoter's
// rows and watermarks go with them (schema 38).
func RecordRun(ctx context.Context, q pg.Querier, actor string, sum Summary, finished time.Time, runErr error) error {
	var msg string
	if runErr != nil {
		msg = runErr.Error()
	}
	if sum.Hops == nil {
		sum.Hops = metrics.HopCounts{}
	}
	hops, err := json.Marshal(sum.Hops)
	if err != nil {
		return fmt.Errorf("recording the dispatch run: %w", err)
	}
	if _, err := q.Exec(ctx, queries.Get("RecordRun"), pgx.NamedArgs{
		"actor": actor, "cutoff": sum.Cutoff, "finished_at": finished, "claimed": sum.Claimed,
		"enqueued": sum.Enqueued, "expired": sum.Expired, "released": sum.Released,
		"out_of_budget": sum.OutOfBudget, "error": msg, "hops": string(hops),
		"promoted": sum.Promoted, "final_until": nullTime(sum.Final), "prov_until": nullTime(sum.Through),
	}); err != nil {
		return fmt.Errorf("recording the dispatch run: %w", err)
	}
	return nil
}

// nullTime is t, or NULL for the zero time.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// ExpireDue is the expire-only part of a claim, for a run that cannot
// publish: up to limit pending reminders due at or before cutoff whose
// deadline is at or before now end as expired (as ClaimDue would end them),
// and none is claimed. It returns how many per channel.
func ExpireDue(ctx context.Context, q pg.Querier, now, cutoff time.Time, limit int, actor string) (map[string]int, error) {
	rows, err := q.Query(ctx, queries.Get("ExpireDue"), pgx.NamedArgs{
		"now": now, "cutoff": cutoff, "limit": limit, "actor": actor,
	})
	if err != nil {
		return nil, fmt.Errorf("expiring due reminders: %w", err)
	}
	out := map[string]int{}
	var channel string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&channel, &n}, func() error { out[channel] = n; return nil }); err != nil {
		return nil, fmt.Errorf("expiring due reminders: %w", err)
	}
	return out, nil
}

// NextDue is the due time of the earliest pending reminder due after after
// (zero when none is), read from reminder_state_pending_due: when Loop's
// next pass has work. Rows due at or before after are the last pass's:
// claimed, or held by another claimer, which would otherwise wake the loop
// at every MinGap for nothing.
func NextDue(ctx context.Context, q pg.Querier, after time.Time) (time.Time, error) {
	var next *time.Time
	if err := q.QueryRow(ctx, queries.Get("NextDue"), pgx.NamedArgs{"after": after}).Scan(&next); err != nil {
		return time.Time{}, fmt.Errorf("reading the next due time: %w", err)
	}
	if next == nil {
		return time.Time{}, nil
	}
	return *next, nil
}

// reportIdleEvery is how often Loop reports idle passes, reportBusyEvery
// how often it reports the merged passes that claimed.
const (
	reportIdleEvery = time.Minute
	reportBusyEvery = time.Second
)

// worthReporting reports whether Loop reports the passes merged in sum
// (none failed or ran out of budget: those are reported at once, on their
// own), sinceLast after the previous report: those that claimed once a
// second, idle ones once a minute (a CronJob's cadence), so a loop that
// passes every MinGap does not write a heartbeat row per pass, nor a
// one-second loop 86,400 a day.
func worthReporting(sum Summary, sinceLast time.Duration) bool {
	if sum.Claimed == 0 {
		return sinceLast >= reportIdleEvery
	}
	return sinceLast >= reportBusyEvery
}

// merge is s followed by next, as one summary: counts and time spent
// summed, the cutoff, watermarks and flags of the later pass (the flags of
// either).
func (s Summary) merge(next Summary) Summary {
	if s.Passes == 0 {
		return next
	}
	next.Passes += s.Passes
	next.Batches += s.Batches
	next.Claimed += s.Claimed
	next.Enqueued += s.Enqueued
	next.Expired += s.Expired
	next.Released += s.Released
	next.Elapsed += s.Elapsed
	next.Promoted += s.Promoted
	next.OutOfBudget = next.OutOfBudget || s.OutOfBudget
	next.BrokerDown = next.BrokerDown || s.BrokerDown
	return next
}

// Report returns an AfterRun hook that records runs (RecordRun) and, with a
// Pushgateway address, pushes each summary and its hop latencies there: a
// CronJob's process is gone before any scrape could reach it. In an --every
// loop, each summary covers the passes since the previous one (Loop merges
// them: at most one a second while passes claim, one a minute while idle).
//
// Each recorded run carries the hop latencies reg's histograms observed since
// the previous recorded run, which the reconciler exports
// (metrics.DispatchRunCollector): no Pushgateway is needed.
func Report(db pg.Querier, actor string, clk clock.Clock, pushgateway string, reg prometheus.Gatherer, log zerolog.Logger) func(context.Context, Summary, error) {
	var hopsBefore metrics.HopCounts
	return func(ctx context.Context, sum Summary, runErr error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		finished := clk.Now()
		if hops, err := metrics.GatherHops(reg); err != nil {
			log.Warn().Err(err).Msg("reading the run's hop latencies")
		} else {
			sum.Hops, hopsBefore = hops.Since(hopsBefore), hops
		}
		if err := RecordRun(ctx, db, actor, sum, finished, runErr); err != nil {
			log.Warn().Err(err).Msg("recording the dispatch run")
		}
		if err := metrics.PushDispatchRun(ctx, pushgateway, metrics.DispatchRun{Cutoff: sum.Cutoff, Finished: finished,
			Elapsed: sum.Elapsed, Batches: sum.Batches, Claimed: sum.Claimed, Enqueued: sum.Enqueued, Expired: sum.Expired,
			Released: sum.Released, OutOfBudget: sum.OutOfBudget, Err: runErr}, reg); err != nil {
			log.Warn().Err(err).Msg("pushing the run's metrics")
		}
	}
}
