package ops

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Stats answers the runbook's questions with numbers. Every age is measured
// from Now; nil means "nothing is waiting".
type Stats struct {
	Now time.Time `json:"now"`
	// ByChannel counts reminders: channel → state → count (states with none are absent).
	ByChannel map[string]map[string]int64 `json:"by_channel"`
	// ByTenant counts reminders: tenant → state → count.
	ByTenant map[string]map[string]int64 `json:"by_tenant"`

	// NewestCreated is when the newest reminder was scheduled: is intent
	// still being written?
	NewestCreated *time.Time `json:"newest_created,omitempty"`
	// OldestDue is the due time of the oldest pending reminder that is due:
	// the first alert (the dispatcher is not keeping up, or not running).
	OldestDue *time.Time `json:"oldest_due,omitempty"`
	// OldestEnqueued is when the oldest enqueued reminder was published: the
	// queue is not draining (no workers, or too few).
	OldestEnqueued *time.Time `json:"oldest_enqueued,omitempty"`
	// OldestRetryDue is the next-attempt time of the most overdue retry.
	OldestRetryDue *time.Time `json:"oldest_retry_due,omitempty"`
	// OldestUnexpired is the deadline of the oldest open reminder past its
	// deadline that is not expired yet, and OldestDeadLease the end of the
	// oldest expired lease: work the reconciler owes (reconciliation lag).
	OldestUnexpired *time.Time `json:"oldest_unexpired,omitempty"`
	OldestDeadLease *time.Time `json:"oldest_dead_lease,omitempty"`

	// DeadlineMisses counts reminders that expired (an operator's expiry of a
	// dead letter excluded) and Quarantined the reminders quarantined (each
	// put a message in a dead-letter queue), by channel, over the last hour
	// and day.
	DeadlineMisses map[string]Window `json:"deadline_misses"`
	Quarantined    map[string]Window `json:"quarantined"`
	// DeadLetters is the depth of each channel's dead-letter queue (nil: no
	// broker was asked; DeadLettersErr says why a broker that was asked did not answer).
	DeadLetters    map[string]int `json:"dead_letters,omitempty"`
	DeadLettersErr string         `json:"dead_letters_error,omitempty"`

	// Dispatch is what is known about the dispatcher's cutoff.
	Dispatch DispatchStats `json:"dispatch"`
}

// Window counts over the last hour and the last day.
type Window struct {
	Hour int64 `json:"hour"`
	Day  int64 `json:"day"`
}

// DispatchStats describes the dispatcher's progress.
type DispatchStats struct {
	// Cutoff is the cutoff of the newest run that finished everything due
	// before it (from dispatch_runs), or, when no run was recorded in the last
	// day, the newest claim event (code "claimed") (Source says which).
	Cutoff *time.Time `json:"cutoff,omitempty"`
	// LastRun is when the newest recorded run finished (any outcome).
	LastRun *time.Time `json:"last_run,omitempty"`
	// RunsLastDay counts recorded runs in the last day.
	RunsLastDay int64 `json:"runs_last_day"`
	// Source is "dispatch_runs", "events" or "" (nothing known).
	Source string `json:"source"`
	// Note says why less is known than usual.
	Note string `json:"note,omitempty"`
}

// Age returns Now − t, or 0 when t is nil.
func (s *Stats) Age(t *time.Time) time.Duration {
	if t == nil {
		return 0
	}
	return s.Now.Sub(*t)
}

// OldestDueAge is the headline: how long the oldest due, pending reminder
// has waited for the dispatcher.
func (s *Stats) OldestDueAge() time.Duration { return s.Age(s.OldestDue) }

// CutoffLag is how far the dispatcher's cutoff trails now (0 when unknown).
// With nothing due, a dispatcher that finds no work leaves no claim event,
// so a lag from events alone means little unless OldestDue is set too.
func (s *Stats) CutoffLag() time.Duration { return s.Age(s.Dispatch.Cutoff) }

// ReadStats reads everything but the dead-letter depths (DLQDepths).
func ReadStats(ctx context.Context, q Querier, now time.Time) (*Stats, error) {
	s := &Stats{
		Now: now, ByChannel: map[string]map[string]int64{}, ByTenant: map[string]map[string]int64{},
		DeadlineMisses: map[string]Window{}, Quarantined: map[string]Window{},
	}
	rows, err := q.Query(ctx, query("StatsCounts"))
	if err != nil {
		return nil, fmt.Errorf("counting reminders: %w", err)
	}
	var (
		grp                    int
		channel, tenant, state string
		n                      int64
	)
	_, err = pgx.ForEachRow(rows, []any{&grp, &channel, &tenant, &state, &n}, func() error {
		m, k := s.ByChannel, channel
		if grp != 1 { // grouping(channel, tenant) is 1 for the (channel, state) set
			m, k = s.ByTenant, tenant
		}
		if m[k] == nil {
			m[k] = map[string]int64{}
		}
		m[k][state] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("counting reminders: %w", err)
	}

	if err := q.QueryRow(ctx, query("StatsAges"), pgx.NamedArgs{"now": now}).Scan(
		&s.NewestCreated, &s.OldestDue, &s.OldestEnqueued, &s.OldestRetryDue, &s.OldestUnexpired, &s.OldestDeadLease); err != nil {
		return nil, fmt.Errorf("reading the oldest waiting work: %w", err)
	}

	rows, err = q.Query(ctx, query("StatsWindows"), pgx.NamedArgs{
		"now": now, "hour_ago": now.Add(-time.Hour), "day_ago": now.Add(-24 * time.Hour),
	})
	if err != nil {
		return nil, fmt.Errorf("counting deadline misses and quarantines: %w", err)
	}
	var kind string
	var w Window
	_, err = pgx.ForEachRow(rows, []any{&channel, &kind, &w.Hour, &w.Day}, func() error {
		if kind == "expired" {
			s.DeadlineMisses[channel] = w
		} else {
			s.Quarantined[channel] = w
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("counting deadline misses and quarantines: %w", err)
	}

	var cutoff, lastRun *time.Time
	err = q.QueryRow(ctx, query("StatsDispatch"), pgx.NamedArgs{"since": now.Add(-24 * time.Hour)}).Scan(
		&cutoff, &lastRun, &s.Dispatch.RunsLastDay)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		// A login without SELECT on dispatch_runs still gets everything else.
		s.Dispatch.Note = "no privilege to read dispatch_runs: " + pgErr.Message
	case err != nil:
		return nil, fmt.Errorf("reading dispatcher runs: %w", err)
	}
	s.Dispatch.LastRun = lastRun
	if s.Dispatch.RunsLastDay > 0 {
		s.Dispatch.Cutoff, s.Dispatch.Source = cutoff, "dispatch_runs"
	} else {
		var at time.Time
		err := q.QueryRow(ctx, query("StatsLastClaim")).Scan(&at)
		switch {
		case err == nil:
			s.Dispatch.Cutoff, s.Dispatch.Source = &at, "events"
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, fmt.Errorf("reading the newest dispatch claim: %w", err)
		}
	}
	return s, nil
}

// DLQDepths asks the broker how many messages each channel's dead-letter
// queue holds (ready ones: messages an operator's read holds are not counted).
func DLQDepths(url string, topo broker.Topology) (map[string]int, error) {
	r := &DLQDepthReader{URL: url, Topology: topo}
	defer r.Close()
	return r.Depths(context.Background())
}

// DLQDepthReader reads dead-letter queue depths over one connection it keeps
// and redials after a failure: the metrics collector asks at every scrape.
type DLQDepthReader struct {
	URL      string
	Topology broker.Topology

	mu   sync.Mutex
	conn *amqp.Connection
}

// Depths returns each channel's dead-letter queue depth.
func (r *DLQDepthReader) Depths(ctx context.Context) (map[string]int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if r.conn == nil || r.conn.IsClosed() {
		conn, err := broker.Dial(r.URL, "nudge-dlq-depth")
		if err != nil {
			return nil, err
		}
		r.conn = conn
	}
	topo := r.Topology.WithDefaults()
	out := map[string]int{}
	for _, c := range reminder.Channels {
		name := topo.DeadQueue(string(c))
		ch, err := r.conn.Channel()
		if err != nil {
			_ = r.conn.Close()
			r.conn = nil
			return nil, fmt.Errorf("opening a channel: %w", err)
		}
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		switch {
		case err == nil:
			out[string(c)] = q.Messages
			_ = ch.Close()
		case isAMQPCode(err, amqp.NotFound):
			out[string(c)] = 0 // never declared: nothing was ever dead-lettered
		default:
			return nil, fmt.Errorf("inspecting %s: %w", name, err)
		}
	}
	return out, nil
}

// Close closes the connection.
func (r *DLQDepthReader) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil {
		_ = r.conn.Close()
		r.conn = nil
	}
}

// DispatchRun is one finished dispatcher run, for RecordDispatchRun.
type DispatchRun struct {
	Actor      string
	Cutoff     time.Time
	FinishedAt time.Time
	Claimed    int
	Enqueued   int
	Expired    int
	Released   int
	// OutOfBudget: the run stopped at its budget with due work possibly left.
	OutOfBudget bool
	// Err is the run's error, if it failed.
	Err error
}

// RecordDispatchRun writes the dispatcher's heartbeat: call it once at the
// end of every run, failed ones included. Stats and the metrics collector
// derive the cutoff lag from it.
func RecordDispatchRun(ctx context.Context, q Querier, r DispatchRun) error {
	var msg string
	if r.Err != nil {
		msg = r.Err.Error()
	}
	if _, err := q.Exec(ctx, query("RecordDispatchRun"), pgx.NamedArgs{
		"actor": r.Actor, "cutoff": r.Cutoff, "finished_at": r.FinishedAt, "claimed": r.Claimed,
		"enqueued": r.Enqueued, "expired": r.Expired, "released": r.Released,
		"out_of_budget": r.OutOfBudget, "error": msg,
	}); err != nil {
		return fmt.Errorf("recording the dispatch run: %w", err)
	}
	return nil
}

// Publish is a reminder's current dispatch batch and that batch's publish
// confirmation. Batch is nil for a reminder never dispatched (or released
// since); ConfirmedAt is nil while the confirmation is not recorded.
type Publish struct {
	Batch       *int64     `json:"batch,omitempty"`
	ConfirmedAt *time.Time `json:"confirmed_at,omitempty"`
	Actor       string     `json:"actor,omitempty"`
}

// PublishOf reads the dispatch batch of reminder id and its confirmation.
func PublishOf(ctx context.Context, q Querier, id int64) (Publish, error) {
	var p Publish
	if err := q.QueryRow(ctx, query("PublishOf"), pgx.NamedArgs{"id": id}).Scan(&p.Batch, &p.ConfirmedAt, &p.Actor); err != nil {
		return p, fmt.Errorf("reading the publish confirmation of reminder %d: %w", id, err)
	}
	return p, nil
}
