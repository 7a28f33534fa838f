package metrics

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// OpenStates are the states nudge_open_reminders reports (every one, with
// zeros, so an alert never depends on a series appearing).
var OpenStates = []reminder.State{
	reminder.Pending, reminder.Leased, reminder.Enqueued, reminder.Sending, reminder.Retrying, reminder.Quarantined,
}

//go:embed queries.sql
var queriesSQL string

var queries = sqlfile.Parse("queries.sql", queriesSQL)

func query(name string) string { return queries.Get(name) }

// DBCollector derives gauges from the database at scrape time, with one
// statement under a timeout. The reconciler registers it: the values are the
// table's truth, whichever process is alive. A scrape's cost follows the
// work in flight, not the table: every exact figure reads a partial index of
// due or in-flight rows (docs/deploy.md lists what bounds each), and the one
// figure that would grow with the schedule, the reminders waiting for a
// later due time, is an estimate that costs nothing to read.
//
//	nudge_newest_reminder_age_seconds      how long ago the newest reminder was scheduled:
//	                                       is intent still being written? (absent: none yet)
//	nudge_oldest_due_age_seconds           the oldest pending, due reminder's wait (0: none)
//	nudge_oldest_enqueued_age_seconds      the oldest enqueued reminder's wait for a worker
//	nudge_open_reminders{channel,state}    open reminders; pending ones only once due (the
//	                                       dispatcher's backlog): a scrape counts work, never
//	                                       the reminders scheduled for later; of the due lazy
//	                                       ones not yet promoted, at most UnpromotedScrapeLimit
//	nudge_pending_reminders_estimate       every pending reminder, due or not, as the planner
//	                                       last counted them (VACUUM/ANALYZE; absent before):
//	                                       the pending state rows, and from schema 44 the lazy
//	                                       reminders not yet promoted (an estimate from
//	                                       statistics, no row read)
//	nudge_deadline_misses_last_hour{channel} reminders expired in the last hour
//	nudge_reconcile_lag_seconds            the oldest repair the reconciler owes: an open
//	                                       reminder past its deadline, or a lease expired
//	nudge_dispatch_cutoff_lag_seconds      now − the newest complete dispatcher run's cutoff
//	                                       (absent until a run is recorded in dispatch_runs)
//	nudge_promoter_lag_seconds             now + H − the promoter's provisional end: how far
//	                                       short of H ahead the state rows of lazy reminders
//	                                       are made (about the time since the last pass;
//	                                       absent before one ran)
//	nudge_promoter_final_age_seconds       now − the promoter's final watermark: 0 while final
//	                                       runs ahead; above 0, a transaction writing reminders
//	                                       has been open about this plus H
//	nudge_db_oldest_transaction_age_seconds how long the oldest transaction open on this
//	                                       database (a client's, not the scrape's) has been
//	                                       open (0: none): while one is, vacuum cannot remove
//	                                       what was deleted or updated since, and the claim
//	                                       reads ever more dead versions (a statement of its own
//	                                       over pg_stat_activity: a row per backend, bounded by
//	                                       max_connections, never by a table)
//	nudge_db_activity_readable             1 if the scrape's login reads every session's activity
//	                                       (pg_read_all_stats or a superuser), 0 if it reads its
//	                                       own only: then the gauge above reads 0 whatever
//	                                       another login holds open
//	nudge_dead_letter_messages{channel}    dead-letter queue depth (when DLQDepth is set)
//	nudge_db_scrape_success, nudge_db_scrape_duration_seconds
//
// UnpromotedScrapeLimit caps the due lazy reminders without a state row a
// scrape reads (schema 43's nudge_unpromoted_due(now, limit), in due order
// from the promoter's provisional end): the oldest due age stays exact, and
// nudge_open_reminders{state="pending"} counts at most this many of them, a
// lower bound when a lagging promoter (a dispatcher down for more than H)
// left more. About one index entry and one primary-key probe each.
const UnpromotedScrapeLimit = 1000

type DBCollector struct {
	DB    pg.Querier
	Clock clock.Clock
	// Timeout bounds a scrape's statement. Zero value: 5 seconds.
	Timeout time.Duration
	// DLQDepth, when set, reports each channel's dead-letter queue depth
	// (broker.DeadLetterDepths does, over a broker connection).
	DLQDepth func(ctx context.Context) (map[string]int, error)

	once  sync.Once
	descs collectorDescs
	// lazyEstimate: the schema was seen to have nudge_unpromoted_estimate
	// (schema 44); a function is not dropped, so it is not looked up again.
	lazyEstimate atomic.Bool
}

type collectorDescs struct {
	newest, pendingEstimate, oldestDue, oldestEnqueued, open, misses, reconcileLag, cutoffLag, dlq, success, duration *prometheus.Desc
	promoterLag, promoterFinalAge, oldestTx, activityReadable                                                         *prometheus.Desc
}

// NewDBCollector returns a collector reading db.
func NewDBCollector(db pg.Querier, clk clock.Clock) *DBCollector {
	return &DBCollector{DB: db, Clock: clk}
}

func (c *DBCollector) init() {
	c.once.Do(func() {
		d := func(name, help string, labels ...string) *prometheus.Desc {
			return prometheus.NewDesc(name, help, labels, nil)
		}
		c.descs = collectorDescs{
			newest:         d("nudge_newest_reminder_age_seconds", "How long ago the newest reminder was scheduled (intake): is intent still being written?"),
			oldestDue:      d("nudge_oldest_due_age_seconds", "How long the oldest pending, due reminder has waited for the dispatcher (0: none waiting)."),
			oldestEnqueued: d("nudge_oldest_enqueued_age_seconds", "How long the oldest enqueued reminder has waited for a worker (0: none)."),
			open: d("nudge_open_reminders", fmt.Sprintf("Reminders not yet terminal, by channel and state; pending ones only once due. "+
				"Pending counts the due lazy reminders not yet promoted up to %d in all: at least that many when a lagging promoter left more.",
				UnpromotedScrapeLimit), "channel", "state"),
			pendingEstimate: d("nudge_pending_reminders_estimate",
				"Pending reminders, due or scheduled for later, as PostgreSQL last estimated them (VACUUM or ANALYZE of reminder_state; of reminders before either)."),
			misses:       d("nudge_deadline_misses_last_hour", "Reminders that expired in the last hour, by channel (from the table).", "channel"),
			reconcileLag: d("nudge_reconcile_lag_seconds", "Age of the oldest repair the reconciler owes: an open reminder past its deadline, or an expired lease (0: none)."),
			cutoffLag:    d("nudge_dispatch_cutoff_lag_seconds", "Now minus the cutoff of the newest dispatcher run that finished everything due before it."),
			dlq:          d("nudge_dead_letter_messages", "Messages in the dead-letter queue, by channel.", "channel"),
			promoterLag: d("nudge_promoter_lag_seconds",
				"Now plus the promoter's H minus its provisional end: how far short of H ahead lazy reminders get their state rows."),
			promoterFinalAge: d("nudge_promoter_final_age_seconds",
				"Now minus the promoter's final watermark (below it every lazy reminder has its state row); above 0 a transaction writing reminders has stayed open about this plus H."),
			oldestTx: d("nudge_db_oldest_transaction_age_seconds",
				"How long the oldest transaction open on this database (a client backend's, not the scrape's own, not idle) has been open; 0 when none."),
			activityReadable: d("nudge_db_activity_readable",
				"1 if the scrape's login reads every session's activity (a superuser or a member of pg_read_all_stats); 0 if only its own, so nudge_db_oldest_transaction_age_seconds is blind to other logins' transactions."),
			success:  d("nudge_db_scrape_success", "1 if the last database-derived scrape succeeded, 0 if not."),
			duration: d("nudge_db_scrape_duration_seconds", "Duration of the database-derived scrape."),
		}
	})
}

// Describe implements prometheus.Collector.
func (c *DBCollector) Describe(ch chan<- *prometheus.Desc) {
	c.init()
	for _, d := range []*prometheus.Desc{c.descs.newest, c.descs.pendingEstimate, c.descs.oldestDue, c.descs.oldestEnqueued, c.descs.open, c.descs.misses,
		c.descs.reconcileLag, c.descs.cutoffLag, c.descs.dlq, c.descs.success, c.descs.duration,
		c.descs.promoterLag, c.descs.promoterFinalAge, c.descs.oldestTx, c.descs.activityReadable} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: DBGauges, the lazy reminders'
// estimate, the promoter's row and the oldest open transaction (four small
// statements), bounded by Timeout.
func (c *DBCollector) Collect(ch chan<- prometheus.Metric) {
	c.init()
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	now := c.Clock.Now()
	var (
		oldestDue, oldestEnq, unexpired, deadLease, cutoff, newest *time.Time
		openJSON, missJSON                                         []byte
		pendingEstimate                                            *float64
	)
	err := c.DB.QueryRow(ctx, query("DBGauges"), pgx.NamedArgs{"now": now, "hour_ago": now.Add(-time.Hour),
		"unpromoted_limit": UnpromotedScrapeLimit}).Scan(
		&oldestDue, &oldestEnq, &unexpired, &deadLease, &cutoff, &openJSON, &missJSON, &newest, &pendingEstimate)
	ok := err == nil
	if ok {
		age := func(t *time.Time) float64 {
			if t == nil {
				return 0
			}
			return max(now.Sub(*t), 0).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(c.descs.oldestDue, prometheus.GaugeValue, age(oldestDue))
		ch <- prometheus.MustNewConstMetric(c.descs.oldestEnqueued, prometheus.GaugeValue, age(oldestEnq))
		ch <- prometheus.MustNewConstMetric(c.descs.reconcileLag, prometheus.GaugeValue, max(age(unexpired), age(deadLease)))
		if newest != nil {
			ch <- prometheus.MustNewConstMetric(c.descs.newest, prometheus.GaugeValue, age(newest))
		}
		// The estimate is left out when its lazy part could not be read: a
		// figure short of every lazy reminder would read as a drop.
		unpromoted, err := c.unpromotedEstimate(ctx)
		ok = err == nil
		switch {
		case !ok:
		case pendingEstimate != nil && *pendingEstimate >= 0: // -1: never vacuumed nor analyzed
			ch <- prometheus.MustNewConstMetric(c.descs.pendingEstimate, prometheus.GaugeValue, *pendingEstimate+unpromoted)
		case unpromoted > 0:
			ch <- prometheus.MustNewConstMetric(c.descs.pendingEstimate, prometheus.GaugeValue, unpromoted)
		}
		if cutoff != nil {
			ch <- prometheus.MustNewConstMetric(c.descs.cutoffLag, prometheus.GaugeValue, age(cutoff))
		}
		var open, miss map[string]float64
		if json.Unmarshal(openJSON, &open) != nil || json.Unmarshal(missJSON, &miss) != nil {
			ok = false
		}
		for _, chn := range reminder.Channels {
			for _, st := range OpenStates {
				ch <- prometheus.MustNewConstMetric(c.descs.open, prometheus.GaugeValue,
					open[string(chn)+"/"+string(st)], string(chn), string(st))
			}
			ch <- prometheus.MustNewConstMetric(c.descs.misses, prometheus.GaugeValue, miss[string(chn)], string(chn))
		}
	}
	if ok {
		ok = c.collectPromoter(ctx, ch, now)
	}
	// Read even when the gauges above failed: it needs none of Nudge's
	// tables, and a long transaction is a likely cause of a slow scrape.
	if !c.collectOldestTransaction(ctx, ch) {
		ok = false
	}
	if c.DLQDepth != nil {
		if depths, err := c.DLQDepth(ctx); err == nil {
			for _, chn := range reminder.Channels {
				ch <- prometheus.MustNewConstMetric(c.descs.dlq, prometheus.GaugeValue, float64(depths[string(chn)]), string(chn))
			}
		} else {
			ok = false
		}
	}
	success := 0.0
	if ok {
		success = 1
	}
	ch <- prometheus.MustNewConstMetric(c.descs.success, prometheus.GaugeValue, success)
	ch <- prometheus.MustNewConstMetric(c.descs.duration, prometheus.GaugeValue, time.Since(start).Seconds())
}

// unpromotedEstimate is the estimate of the lazy reminders not yet promoted
// (schema 44's nudge_unpromoted_estimate; 0 on a schema before it, where
// nothing is lazy): they have no state row, so DBGauges' estimate of the
// pending state rows leaves them out.
func (c *DBCollector) unpromotedEstimate(ctx context.Context) (float64, error) {
	if !c.lazyEstimate.Load() {
		var has bool
		if err := c.DB.QueryRow(ctx, query("HasUnpromotedEstimate")).Scan(&has); err != nil || !has {
			return 0, err
		}
		c.lazyEstimate.Store(true)
	}
	var n float64
	err := c.DB.QueryRow(ctx, query("UnpromotedEstimate")).Scan(&n)
	return n, err
}

// collectPromoter sends the promoter's gauges (a second statement: one row
// by primary key); false when it failed.
func (c *DBCollector) collectPromoter(ctx context.Context, ch chan<- prometheus.Metric, now time.Time) bool {
	var lag time.Duration
	var final time.Time
	err := c.DB.QueryRow(ctx, query("PromoterGauges"), pgx.NamedArgs{"now": now}).Scan(&lag, &final)
	if errors.Is(err, pgx.ErrNoRows) {
		return true
	}
	if err != nil {
		return false
	}
	ch <- prometheus.MustNewConstMetric(c.descs.promoterLag, prometheus.GaugeValue, lag.Seconds())
	ch <- prometheus.MustNewConstMetric(c.descs.promoterFinalAge, prometheus.GaugeValue, max(now.Sub(final), 0).Seconds())
	return true
}

// collectOldestTransaction sends the age of the oldest transaction open on
// the database (OldestTransaction, over pg_stat_activity: bounded by
// max_connections); false when it failed. The age is the database's own
// (statement time − xact_start), not c.Clock's: both ends are its clock.
func (c *DBCollector) collectOldestTransaction(ctx context.Context, ch chan<- prometheus.Metric) bool {
	var age time.Duration
	var readable bool
	if err := c.DB.QueryRow(ctx, query("OldestTransaction")).Scan(&age, &readable); err != nil {
		return false
	}
	ch <- prometheus.MustNewConstMetric(c.descs.oldestTx, prometheus.GaugeValue, max(age, 0).Seconds())
	readableValue := 0.0
	if readable {
		readableValue = 1
	}
	ch <- prometheus.MustNewConstMetric(c.descs.activityReadable, prometheus.GaugeValue, readableValue)
	return true
}
