package ops

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/pg"
)

// Stats answers the runbook's questions with numbers. Every age is measured
// from Now; nil means "nothing is waiting".
type Stats struct {
	Now time.Time `json:"now"`
	// ByChannel counts reminders: channel → state → count (states with none are absent).
	ByChannel map[string]map[string]int64 `json:"by_channel"`
	// ByTenant counts reminders: tenant → state → count.
	ByTenant map[string]map[string]int64 `json:"by_tenant"`
	// Estimated lists the states whose counts in ByChannel and ByTenant are
	// estimates (nil: every count is exact). From ExactCountsUpToPages,
	// unless StatsOptions.Exact, the counts are read at a cost bounded by the
	// work and a sample (StatsCountsBounded): the work is exact (pending and
	// due, and every in-flight state), the pending reminders scheduled for
	// later and the terminal history are estimated from a sample of
	// SamplePages pages, so pending and the terminal states are listed here.
	Estimated []string `json:"estimated_states,omitempty"`

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

	// Recent counts the terminal outcomes of the last RecentWindow by
	// channel: channel → outcome (delivered, failed, expired, canceled) →
	// count.
	Recent map[string]map[string]int64 `json:"recent"`
}

// RecentWindow is the window of Stats.Recent: short enough to say what the
// fleet does now, long enough to span a few dispatcher runs.
const RecentWindow = 5 * time.Minute

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

// IsEstimated reports whether the counts of state are estimates (Estimated).
func (s *Stats) IsEstimated(state string) bool { return slices.Contains(s.Estimated, state) }

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

// Bounds of the counts' cost (issue 18: an operator's read, which the
// console repeats every 15 seconds, must not grow with the reminders
// scheduled months ahead nor with retention's history).
const (
	// ExactCountsUpToPages is the size of reminders, in 8 KiB pages, below
	// which Stats counts every row exactly (StatsCounts): 16 MiB, about
	// 100,000 reminders of a small payload, where the exact count takes
	// tens of milliseconds.
	ExactCountsUpToPages = 2048
	// SamplePages is about how many pages of reminder_state and of
	// reminders the estimated counts read, each.
	SamplePages = 100
)

// StatsOptions says how Stats counts.
type StatsOptions struct {
	// Exact counts every row whatever the table's size (nudgectl stats
	// --exact): seconds at 1M reminders. Zero value: exact while reminders
	// is below ExactCountsUpToPages, estimated from it.
	Exact bool
	// ExactUpToPages replaces ExactCountsUpToPages and SamplePages replaces
	// SamplePages (zero values: those), for tests and trials.
	ExactUpToPages, SamplePages int
}

// ReadStats reads everything but the dead-letter depths (DLQDepths), the
// counts exact while reminders is below ExactCountsUpToPages and in part
// estimated from it (Stats.Estimated).
func ReadStats(ctx context.Context, q pg.Querier, now time.Time) (*Stats, error) {
	return ReadStatsWith(ctx, q, now, StatsOptions{})
}

// estimatedStates are the states whose counts StatsCountsBounded estimates.
var estimatedStates = []string{"pending", "delivered", "failed", "expired", "canceled"}

// ReadStatsWith is ReadStats, counting as o says.
func ReadStatsWith(ctx context.Context, q pg.Querier, now time.Time, o StatsOptions) (*Stats, error) {
	s := &Stats{
		Now: now, ByChannel: map[string]map[string]int64{}, ByTenant: map[string]map[string]int64{},
		DeadlineMisses: map[string]Window{}, Quarantined: map[string]Window{},
	}
	name, args := "StatsCounts", pgx.NamedArgs{}
	if !o.Exact {
		var statePages, lazyPages int64
		if err := q.QueryRow(ctx, query("StatsPages")).Scan(&statePages, &lazyPages); err != nil {
			return nil, fmt.Errorf("sizing the reminders: %w", err)
		}
		if lazyPages >= int64(cmp.Or(o.ExactUpToPages, ExactCountsUpToPages)) {
			sample := float64(cmp.Or(o.SamplePages, SamplePages))
			pct := func(pages int64) float64 { return min(100, 100*sample/float64(max(pages, 1))) }
			name, args = "StatsCountsBounded", pgx.NamedArgs{"now": now,
				"state_pct": pct(statePages), "state_pages": statePages, "lazy_pct": pct(lazyPages), "lazy_pages": lazyPages}
			s.Estimated = estimatedStates
		}
	}
	rows, err := q.Query(ctx, query(name), args)
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

	s.Recent = map[string]map[string]int64{}
	rows, err = q.Query(ctx, query("StatsRecent"), pgx.NamedArgs{"now": now, "since": now.Add(-RecentWindow)})
	if err != nil {
		return nil, fmt.Errorf("counting recent outcomes: %w", err)
	}
	_, err = pgx.ForEachRow(rows, []any{&channel, &state, &n}, func() error {
		if s.Recent[channel] == nil {
			s.Recent[channel] = map[string]int64{}
		}
		s.Recent[channel][state] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("counting recent outcomes: %w", err)
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
	r := &broker.DeadLetterDepths{URL: url, Topology: topo}
	defer r.Close()
	return r.Depths(context.Background())
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
func PublishOf(ctx context.Context, q pg.Querier, id int64) (Publish, error) {
	var p Publish
	if err := q.QueryRow(ctx, query("PublishOf"), pgx.NamedArgs{"id": id}).Scan(&p.Batch, &p.ConfirmedAt, &p.Actor); err != nil {
		return p, fmt.Errorf("reading the publish confirmation of reminder %d: %w", id, err)
	}
	return p, nil
}
