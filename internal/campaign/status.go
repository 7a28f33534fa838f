package campaign

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Report is a campaign's progress as operators read it (`nudgectl campaign
// status`, the console). Its JSON field names are stable (docs/operations.md).
type Report struct {
	ID      int64  `json:"id"`
	Tenant  string `json:"tenant"`
	Name    string `json:"name"`
	Source  string `json:"source"`
	Channel string `json:"channel"`
	State   State  `json:"state"`
	// SliceSize is the campaign's own slice size (nil: the planner's
	// configured size, schema 25).
	SliceSize *int `json:"slice_size"`
	// LeaseSeconds is how long one slice may hold the campaign.
	LeaseSeconds float64 `json:"lease_seconds"`
	// Planned counts the reminders planned, BadRows the audience rows that
	// could not become one (campaign_bad_rows says why).
	Planned int64 `json:"planned"`
	BadRows int64 `json:"bad_rows"`
	// Remaining counts the audience rows after the cursor, read from the
	// source now. A reader the source is not granted to gets an estimate
	// instead (RemainingEstimated): the source's row count as PostgreSQL
	// last estimated it, less the rows read; nil when there is none (a
	// view), with RemainingError saying why it could not be counted. 0
	// once the campaign ended; a late campaign's remainder is Unplanned.
	Remaining          *int64 `json:"remaining"`
	RemainingEstimated bool   `json:"remaining_estimated"`
	RemainingError     string `json:"remaining_error,omitempty"`
	// SlicesDone counts the slices committed (checkpoints).
	SlicesDone int64 `json:"slices_done"`
	// LastCheckpoint is when the last slice committed (nil: none yet).
	LastCheckpoint *time.Time `json:"last_checkpoint"`
	// CheckpointLagSeconds is how long a campaign still planning or paused
	// has gone without a checkpoint: since its last slice, or since it was
	// created when it has none. Nil once it ended.
	CheckpointLagSeconds *float64 `json:"checkpoint_lag_seconds"`
	// Unplanned counts the audience rows a late campaign left unplanned
	// when its deadline passed, and LateSlices the slices they make: the
	// work that was late. Nil and 0 unless the campaign is late.
	Unplanned  *int64     `json:"unplanned"`
	LateSlices int64      `json:"late_slices"`
	Deadline   time.Time  `json:"deadline"`
	CreatedAt  time.Time  `json:"created_at"`
	EndedAt    *time.Time `json:"ended_at"`
	// Deliveries counts the campaign's reminders by state, every state
	// present (zeros included): pending, leased, enqueued, sending,
	// retrying, quarantined, delivered, failed, expired, canceled.
	Deliveries map[reminder.State]int64 `json:"deliveries"`
	// Shadow: a shadow run, which plans and counts without creating
	// reminders (Planned is then the intended count).
	Shadow bool `json:"shadow"`
	// The measured time of this campaign's slices (campaign_slices.took_ms):
	// how many were measured, their median and 95th percentile in
	// milliseconds (nil before the first).
	SlicesMeasured int64    `json:"slices_measured"`
	SliceMSMedian  *float64 `json:"slice_ms_median"`
	SliceMSP95     *float64 `json:"slice_ms_p95"`
	// Comparison is a shadow run's counts per slice beside a real run's:
	// for a shadow run, always (without a real run to compare with, its own
	// intended counts); for a real run, when a shadow run over the same
	// tenant, source and slice size exists or one was named. Nil otherwise.
	Comparison *Comparison `json:"comparison"`
}

// MaxSlicesListed bounds the slices a Comparison lists (its totals count
// them all; nudgectl campaign compare prints every one).
const MaxSlicesListed = 1000

// Comparison is a shadow run beside a real run, per slice and in total.
type Comparison struct {
	ShadowID int64 `json:"shadow_id"`
	// RealID is the real run compared with; nil: none (the shadow run's own
	// counts are listed, the real side empty).
	RealID *int64 `json:"real_id"`
	// Chosen says how RealID (or ShadowID, for a real run's report) was
	// found: "named" (--compare), "latest" (the latest campaign of the other
	// kind over the same tenant, source and slice size) or "none".
	Chosen string `json:"chosen"`
	// Slices counts the slices either campaign has; SlicesDiffer those whose
	// rows read, intents or bad rows differ (or that only one has); Same:
	// none differs. Without a real run, SlicesDiffer is 0 and Same false.
	Slices       int64 `json:"slices"`
	SlicesDiffer int64 `json:"slices_differ"`
	Same         bool  `json:"same"`
	// Totals over every slice.
	ShadowRows    int64 `json:"shadow_rows"`
	ShadowIntents int64 `json:"shadow_intents"`
	ShadowBad     int64 `json:"shadow_bad"`
	RealRows      int64 `json:"real_rows"`
	RealIntents   int64 `json:"real_intents"`
	RealBad       int64 `json:"real_bad"`
	// PerSlice lists the first MaxSlicesListed slices, in order.
	PerSlice  []SliceComparison `json:"per_slice"`
	Truncated bool              `json:"per_slice_truncated"`
}

// ErrNotComparable: --compare named a campaign of the same kind (two shadow
// runs, or two real ones).
var ErrNotComparable = errors.New("not a shadow run and a real run")

// Progress is the share of the audience the campaign has read (planned and
// bad rows over those plus the remaining ones), in [0, 1]; ok false when the
// remainder is unknown.
func (r Report) Progress() (done, total int64, ok bool) {
	done = r.Planned + r.BadRows
	switch {
	case r.State == Late && r.Unplanned != nil:
		return done, done + *r.Unplanned, true
	case r.Remaining == nil:
		return done, 0, false
	}
	return done, done + *r.Remaining, true
}

// LateSlices is how many slices of sliceSize the unplanned remainder makes.
func LateSlices(unplanned int64, sliceSize int) int64 {
	if unplanned <= 0 || sliceSize <= 0 {
		return 0
	}
	return (unplanned + int64(sliceSize) - 1) / int64(sliceSize)
}

// keyRange is the bytewise range of the keys campaign:<id>:…: from the
// prefix to the prefix with its last byte (':') raised by one.
func keyRange(id int64) (from, to string) {
	return fmt.Sprintf("campaign:%d:", id), fmt.Sprintf("campaign:%d;", id)
}

// GetReport reads campaign id's report at now, as q's login (nudge_operator,
// or the planner), compared with the latest campaign of the other kind
// (shadow or real) over its tenant, source and slice size, if any. Reading
// the remainder needs the right to read the audience source; without it the
// report says so and goes on.
func GetReport(ctx context.Context, q pg.Querier, id int64, now time.Time) (Report, error) {
	return GetReportComparedWith(ctx, q, id, now, 0)
}

// GetReportComparedWith is GetReport compared with campaign with (0: the
// latest of the other kind, as GetReport), which must be of the other kind
// (ErrNotComparable).
func GetReportComparedWith(ctx context.Context, q pg.Querier, id int64, now time.Time, with int64) (Report, error) {
	r, err := getReport(ctx, q, id, now)
	if err != nil {
		return Report{}, err
	}
	if err := q.QueryRow(ctx, queries.Get("SliceTime"), id).Scan(&r.SlicesMeasured, &r.SliceMSMedian,
		&r.SliceMSP95); err != nil {
		return Report{}, fmt.Errorf("reading the slice time of campaign %d: %w", id, err)
	}
	if r.Comparison, err = compare(ctx, q, r, with); err != nil {
		return Report{}, err
	}
	return r, nil
}

// compare finds the campaign r is compared with (with, or the latest of the
// other kind) and reads the comparison; nil for a real run with none.
func compare(ctx context.Context, q pg.Querier, r Report, with int64) (*Comparison, error) {
	chosen := "named"
	if with == 0 {
		chosen = "latest"
		err := q.QueryRow(ctx, queries.Get("Counterpart"), r.ID).Scan(&with)
		if errors.Is(err, pgx.ErrNoRows) {
			chosen = "none"
		} else if err != nil {
			return nil, fmt.Errorf("finding the campaign to compare campaign %d with: %w", r.ID, err)
		}
	} else {
		var shadow bool
		err := q.QueryRow(ctx, queries.Get("IsShadow"), with).Scan(&shadow)
		if errors.Is(err, pgx.ErrNoRows) {
			err = ErrNotFound
		}
		if err != nil {
			return nil, fmt.Errorf("comparing campaign %d with %d: %w", r.ID, with, err)
		}
		if shadow == r.Shadow {
			kind := "real runs"
			if shadow {
				kind = "shadow runs"
			}
			return nil, fmt.Errorf("comparing campaign %d with %d: both are %s: %w", r.ID, with, kind, ErrNotComparable)
		}
	}
	c := Comparison{ShadowID: r.ID, Chosen: chosen}
	switch {
	case chosen == "none" && !r.Shadow:
		return nil, nil
	case chosen == "none":
	case r.Shadow:
		c.RealID = &with
	default:
		real := r.ID
		c.ShadowID, c.RealID = with, &real
	}
	if err := q.QueryRow(ctx, queries.Get("CompareTotals"), c.ShadowID, c.RealID).Scan(&c.Slices, &c.SlicesDiffer,
		&c.ShadowRows, &c.ShadowIntents, &c.ShadowBad, &c.RealRows, &c.RealIntents, &c.RealBad); err != nil {
		return nil, fmt.Errorf("comparing campaign %d with %v: %w", c.ShadowID, with, err)
	}
	rows, err := q.Query(ctx, queries.Get("CompareSlices"), c.ShadowID, c.RealID, MaxSlicesListed)
	if err == nil {
		c.PerSlice, err = pgx.CollectRows(rows, pgx.RowToStructByPos[SliceComparison])
	}
	if err != nil {
		return nil, fmt.Errorf("comparing campaign %d with %v: %w", c.ShadowID, with, err)
	}
	c.Truncated = c.Slices > int64(len(c.PerSlice))
	if c.RealID == nil {
		c.SlicesDiffer = 0
	} else {
		c.Same = c.SlicesDiffer == 0
	}
	return &c, nil
}

func getReport(ctx context.Context, q pg.Querier, id int64, now time.Time) (Report, error) {
	var (
		r              Report
		fence          int64
		sliceSize      int
		updatedAt      time.Time
		lastCheckpoint *time.Time
	)
	err := q.QueryRow(ctx, queries.Get("Report"), id).Scan(&r.ID, &r.Tenant, &r.Name, &r.Source, &r.Channel,
		&r.State, &r.SliceSize, &sliceSize, &r.LeaseSeconds, &r.Planned, &r.BadRows, &fence, &r.Unplanned, &r.Deadline,
		&r.CreatedAt, &updatedAt, &r.EndedAt, &lastCheckpoint, &r.Shadow)
	if errors.Is(err, pgx.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Report{}, fmt.Errorf("reading campaign %d: %w", id, err)
	}
	r.SlicesDone, r.LastCheckpoint = fence, lastCheckpoint
	if r.State == Planning || r.State == Paused {
		since := r.CreatedAt
		if lastCheckpoint != nil {
			since = *lastCheckpoint
		}
		lag := max(now.Sub(since), 0).Seconds()
		r.CheckpointLagSeconds = &lag
	}
	if r.State == Late && r.Unplanned != nil {
		r.LateSlices = LateSlices(*r.Unplanned, sliceSize)
	}
	r.Deliveries = make(map[reminder.State]int64, len(reminder.States))
	for _, st := range reminder.States {
		r.Deliveries[st] = 0
	}
	from, to := keyRange(id)
	rows, err := q.Query(ctx, queries.Get("Deliveries"), r.Tenant, from, to)
	if err != nil {
		return Report{}, fmt.Errorf("counting the reminders of campaign %d: %w", id, err)
	}
	var (
		st reminder.State
		n  int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&st, &n}, func() error { r.Deliveries[st] = n; return nil }); err != nil {
		return Report{}, fmt.Errorf("counting the reminders of campaign %d: %w", id, err)
	}
	left, err := Remaining(ctx, q, id)
	if err == nil {
		r.Remaining = &left
		return r, nil
	}
	r.RemainingError = err.Error()
	var est *int64
	if err := q.QueryRow(ctx, queries.Get("RemainingEstimate"), id).Scan(&est); err != nil {
		return Report{}, fmt.Errorf("estimating what campaign %d has left: %w", id, err)
	}
	r.Remaining, r.RemainingEstimated = est, est != nil
	return r, nil
}
