// Package retention keeps the reminders tables bounded: terminal reminders
// lose their payload (data emptied, recipient masked, delivery attempts
// deleted) after one window, are deleted after a longer one, and their
// decision events are deleted after the longest, once the reminder itself is
// gone. Open reminders are never touched.
//
// A pass works in bounded batches (one statement each, oldest first, rows
// another transaction holds are skipped and taken next time) and is
// idempotent: what it already did no longer matches, so a second pass over
// the same data writes nothing. The reconciler runs one pass per loop.
package retention

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/internal/sqlfile"
)

//go:embed queries.sql
var queriesSQL string

var queries = sqlfile.Parse("queries.sql", queriesSQL)

func query(name string) string { return queries.Get(name) }

// Default windows.
const (
	DefaultPayloadAfter  = 7 * 24 * time.Hour
	DefaultReminderAfter = 30 * 24 * time.Hour
	DefaultEventAfter    = 180 * 24 * time.Hour
	DefaultBatch         = 1000
	DefaultMaxBatches    = 20
)

// Config sets the retention windows. Each window is measured from the time
// a reminder reached its terminal state (finished_at).
type Config struct {
	// PayloadAfter: a terminal reminder's data is emptied, its recipient
	// masked (first character and domain of an email, the first three and
	// last two characters of a phone number) and its delivery attempts are
	// deleted this long after it finished. It can no longer be replayed.
	// Zero value: DefaultPayloadAfter (7 days).
	PayloadAfter time.Duration
	// ReminderAfter: a terminal reminder is deleted this long after it
	// finished. Zero value: DefaultReminderAfter (30 days).
	ReminderAfter time.Duration
	// EventAfter: the events of a deleted reminder are deleted once this
	// old, and so are operator_audit rows. Decision events outlive the
	// reminders they describe. Zero value: DefaultEventAfter (180 days).
	EventAfter time.Duration
	// Batch bounds the rows of each statement. Zero value: DefaultBatch (1,000).
	Batch int
	// MaxBatches bounds a pass: at most this many statements of each kind;
	// what is left waits for the next pass. Zero value: DefaultMaxBatches (20).
	MaxBatches int
}

// WithDefaults returns c with zero fields filled.
func (c Config) WithDefaults() Config {
	c.PayloadAfter = cmp.Or(c.PayloadAfter, DefaultPayloadAfter)
	c.ReminderAfter = cmp.Or(c.ReminderAfter, DefaultReminderAfter)
	c.EventAfter = cmp.Or(c.EventAfter, DefaultEventAfter)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	c.MaxBatches = cmp.Or(c.MaxBatches, DefaultMaxBatches)
	return c
}

// Validate reports operator mistakes in c (after WithDefaults).
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"--retain-payload", c.PayloadAfter}, {"--retain-reminders", c.ReminderAfter}, {"--retain-events", c.EventAfter}} {
		if d.v < time.Hour {
			errs = append(errs, fmt.Errorf("%s %s: must be at least 1h", d.name, d.v))
		}
	}
	if c.ReminderAfter < c.PayloadAfter {
		errs = append(errs, fmt.Errorf("--retain-reminders %s is shorter than --retain-payload %s", c.ReminderAfter, c.PayloadAfter))
	}
	if c.EventAfter < c.ReminderAfter {
		errs = append(errs, fmt.Errorf("--retain-events %s is shorter than --retain-reminders %s: decision events must outlive the reminders",
			c.EventAfter, c.ReminderAfter))
	}
	if c.Batch < 0 || c.MaxBatches < 0 {
		errs = append(errs, errors.New("--retention-batch and --retention-max-batches must not be negative"))
	}
	return errors.Join(errs...)
}

// RegisterFlags adds the retention flags, with their defaults, to fs.
func RegisterFlags(fs *pflag.FlagSet, c *Config) {
	fs.DurationVar(&c.PayloadAfter, "retain-payload", DefaultPayloadAfter,
		"remove a finished reminder's payload (data, recipient) and delivery attempts this long after it finished")
	fs.DurationVar(&c.ReminderAfter, "retain-reminders", DefaultReminderAfter,
		"delete a finished reminder this long after it finished")
	fs.DurationVar(&c.EventAfter, "retain-events", DefaultEventAfter,
		"delete the decision events of deleted reminders, and operator audit rows, once this old")
	fs.IntVar(&c.Batch, "retention-batch", DefaultBatch, "rows per retention statement")
	fs.IntVar(&c.MaxBatches, "retention-max-batches", DefaultMaxBatches, "retention statements of each kind per pass")
}

// Cleaner runs retention passes. Safe for one pass at a time per Cleaner;
// passes of several Cleaners (two reconcilers) may overlap safely.
type Cleaner struct {
	DB     pg.Querier
	Clock  clock.Clock
	Config Config

	mu sync.Mutex
	// eventsFrom is where the events sweep resumes: it walks ids upwards in
	// chunks and starts over from the lowest id once it reaches events newer
	// than the window (events it kept, of reminders still present, get
	// reconsidered every sweep).
	eventsFrom int64
}

// New returns a Cleaner on db.
func New(db pg.Querier, cfg Config, clk clock.Clock) *Cleaner {
	return &Cleaner{DB: db, Config: cfg, Clock: clk}
}

// Summary counts what one pass removed.
type Summary struct {
	// Purged reminders lost their payload; AttemptsDeleted counts their
	// delivery attempts.
	Purged          int64
	AttemptsDeleted int64
	// RemindersDeleted are terminal reminders past ReminderAfter.
	RemindersDeleted int64
	// EventsDeleted are events of deleted reminders past EventAfter.
	EventsDeleted int64
	// AuditDeleted are operator_audit rows, RunsDeleted dispatch_runs rows,
	// ConfirmsDeleted publish_confirms rows (one per dispatched batch).
	AuditDeleted    int64
	RunsDeleted     int64
	ConfirmsDeleted int64
	// FlowsDeleted are rate-limit flows idle for IdleFlowAfter.
	FlowsDeleted int64
	// StatusesDeleted are delivery statuses providers reported
	// (sms_message_status) past PayloadAfter.
	StatusesDeleted int64
	// Statements the pass ran.
	Statements int
	// More is set when a kind stopped at MaxBatches with work left.
	More    bool
	Elapsed time.Duration
}

// Total is every row the pass changed or removed.
func (s Summary) Total() int64 {
	return s.Purged + s.AttemptsDeleted + s.RemindersDeleted + s.EventsDeleted + s.AuditDeleted + s.RunsDeleted +
		s.ConfirmsDeleted + s.FlowsDeleted + s.StatusesDeleted
}

// IdleFlowAfter is how long a rate-limit flow (a channel's tenant on a
// provider account) must have been idle before its row is deleted: its last
// ask, its pacing state and its last deferred turn all that old. Its state
// only matters for seconds; the row costs every reservation on the account a
// read, so tenants that stopped sending must not keep one.
const IdleFlowAfter = 24 * time.Hour

// Pass runs one bounded retention pass.
func (c *Cleaner) Pass(ctx context.Context) (Summary, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cfg := c.Config.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	start := c.Clock.Now()
	var sum Summary
	defer func() { sum.Elapsed = c.Clock.Now().Sub(start) }()

	steps := []struct {
		what   string
		sql    string
		window time.Duration
		counts []*int64 // the first is the batch's row count
	}{
		// Deleting first: a row past both windows is deleted, not purged then deleted.
		{"deleting reminders", query("DeleteReminders"), cfg.ReminderAfter, []*int64{&sum.RemindersDeleted}},
		{"removing payloads", query("PurgePayloads"), cfg.PayloadAfter, []*int64{&sum.Purged, &sum.AttemptsDeleted}},
		{"deleting operator audit rows", query("DeleteAudit"), cfg.EventAfter, []*int64{&sum.AuditDeleted}},
		{"deleting dispatch runs", query("DeleteRuns"), cfg.ReminderAfter, []*int64{&sum.RunsDeleted}},
		{"deleting publish confirmations", query("DeleteConfirms"), cfg.ReminderAfter, []*int64{&sum.ConfirmsDeleted}},
		{"deleting idle rate-limit flows", query("DeleteIdleFlows"), IdleFlowAfter, []*int64{&sum.FlowsDeleted}},
		{"deleting reported message statuses", query("DeleteMessageStatuses"), cfg.PayloadAfter, []*int64{&sum.StatusesDeleted}},
	}
	for _, st := range steps {
		if err := c.batches(ctx, cfg, &sum, st.what, st.sql, st.window, st.counts); err != nil {
			return sum, err
		}
	}
	if err := c.sweepEvents(ctx, cfg, &sum); err != nil {
		return sum, err
	}
	return sum, nil
}

// batches runs one statement kind until a batch comes back short or the
// pass's bound is reached.
func (c *Cleaner) batches(ctx context.Context, cfg Config, sum *Summary, what, sql string, window time.Duration, counts []*int64) error {
	for i := 0; ; i++ {
		if i == cfg.MaxBatches {
			sum.More = true
			return nil
		}
		now := c.Clock.Now()
		got := make([]int64, len(counts))
		dest := make([]any, len(counts))
		for j := range got {
			dest[j] = &got[j]
		}
		sum.Statements++
		if err := c.DB.QueryRow(ctx, sql, pgx.NamedArgs{
			"now": now, "before": now.Add(-window), "limit": cfg.Batch,
		}).Scan(dest...); err != nil {
			return fmt.Errorf("retention: %s: %w", what, err)
		}
		for j, n := range got {
			*counts[j] += n
		}
		if got[0] < int64(cfg.Batch) {
			return nil
		}
	}
}

// sweepEvents deletes old events of deleted reminders, walking the primary
// key upwards in chunks of Batch events from where the last pass stopped,
// until a chunk holds only events newer than the window (then the next pass
// starts over from the lowest id, reconsidering the events it kept because
// their reminder still existed) or the pass's bound is reached.
func (c *Cleaner) sweepEvents(ctx context.Context, cfg Config, sum *Summary) error {
	var lo, hi int64
	sum.Statements++
	if err := c.DB.QueryRow(ctx, query("EventsRange")).Scan(&lo, &hi); err != nil {
		return fmt.Errorf("retention: reading the events range: %w", err)
	}
	lo = max(lo, c.eventsFrom)
	for i := 0; ; i++ {
		if hi == 0 || lo > hi {
			c.eventsFrom = 0
			return nil
		}
		if i == cfg.MaxBatches {
			c.eventsFrom = lo
			sum.More = true
			return nil
		}
		now := c.Clock.Now()
		var n, next int64
		var horizon bool
		sum.Statements++
		if err := c.DB.QueryRow(ctx, query("DeleteEvents"), pgx.NamedArgs{
			"lo": lo, "limit": cfg.Batch, "max": hi, "before": now.Add(-cfg.EventAfter),
		}).Scan(&n, &next, &horizon); err != nil {
			return fmt.Errorf("retention: deleting events: %w", err)
		}
		sum.EventsDeleted += n
		if horizon {
			c.eventsFrom = 0
			return nil
		}
		lo = next
	}
}
