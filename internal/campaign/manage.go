package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/localtime"
)

// Spec is a campaign to create (nudge_campaign_create).
type Spec struct {
	Tenant, Name, Channel, Template string
	// Source names an audience source registered for Tenant.
	Source string
	// The due rule, exactly one of: DueAt; DueLocal, one wall-clock time
	// read in each recipient's zone; DaysBefore the source's date column
	// (at that instant, or with AtLocal at that local time of day).
	DueAt      *time.Time
	DueLocal   *localtime.Wall
	DaysBefore *int
	AtLocal    *localtime.TimeOfDay
	// DefaultZone is the zone of audience rows without one ("": UTC).
	DefaultZone string
	Deadline    time.Time
	// SliceSize zero: the planner's configured size (DefaultSliceSize
	// unless planner --slice-size says otherwise). Lease zero: 30 s.
	SliceSize int
	Lease     time.Duration
	// Shadow plans without creating sendable reminders, recording the
	// count per slice (and, with ShadowKeys, the audience keys).
	Shadow, ShadowKeys bool
	// Admission is the admission's record (Admit), stored with the campaign.
	Admission *Admission
}

// Create creates the campaign, or finds the one of the same tenant and name
// (created false), as q's login (nudge_intake for its tenants, or nudge_operator).
func Create(ctx context.Context, q pg.Querier, s Spec) (id int64, created bool, err error) {
	var size *int
	if s.SliceSize > 0 {
		size = &s.SliceSize
	}
	var lease *time.Duration
	if s.Lease > 0 {
		lease = &s.Lease
	}
	var dueLocal, atLocal, zone *string
	if s.DueLocal != nil {
		w := s.DueLocal.String()
		dueLocal = &w
	}
	if s.AtLocal != nil {
		t := s.AtLocal.String()
		atLocal = &t
	}
	if s.DefaultZone != "" {
		zone = &s.DefaultZone
	}
	var adm []byte
	if s.Admission != nil {
		if adm, err = json.Marshal(s.Admission); err != nil {
			return 0, false, fmt.Errorf("creating campaign %q: recording its admission: %w", s.Name, err)
		}
	}
	err = q.QueryRow(ctx, query("Create"), s.Tenant, s.Name, s.Channel, s.Template, s.Source, s.DueAt,
		s.DaysBefore, s.Deadline, size, lease, dueLocal, atLocal, zone, s.Shadow, s.ShadowKeys, adm).Scan(&id, &created)
	if err != nil {
		return 0, false, fmt.Errorf("creating campaign %q of tenant %q: %w", s.Name, s.Tenant, err)
	}
	return id, created, nil
}

// Action is what Set does to a campaign.
type Action string

// The actions of Set.
const (
	Pause  Action = "pause"
	Resume Action = "resume"
	Cancel Action = "cancel"
)

// ErrNotFound: the tenant has no such campaign.
var ErrNotFound = errors.New("campaign not found")

// Set pauses, resumes or cancels a campaign and returns its state after it
// (unchanged when the action does not apply to the state it is in).
func Set(ctx context.Context, q pg.Querier, tenant string, id int64, a Action) (State, error) {
	var st State
	err := q.QueryRow(ctx, query("Set"), tenant, id, string(a)).Scan(&st)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "P0002" {
		err = ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("%s campaign %d of tenant %q: %w", a, id, tenant, err)
	}
	return st, nil
}

// Status is a campaign's progress.
type Status struct {
	ID                   int64
	Tenant, Name, Source string
	State                State
	Planned, Bad, Slices int64
	Unplanned            *int64
	Deadline             time.Time
	LastCheckpoint       *time.Time
}

// List reads the status of up to limit campaigns (of tenant, when not
// empty), oldest first.
func List(ctx context.Context, q pg.Querier, tenant string, limit int) ([]Status, error) {
	var t *string
	if tenant != "" {
		t = &tenant
	}
	rows, err := q.Query(ctx, query("List"), t, limit)
	if err != nil {
		return nil, fmt.Errorf("listing campaigns: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Status])
	if err != nil {
		return nil, fmt.Errorf("listing campaigns: %w", err)
	}
	return out, nil
}

// Remaining counts the audience rows a campaign still has to plan (0 once
// it ended: a late campaign's remainder is Status.Unplanned). It reads the
// audience, so it needs the caller to be allowed to.
func Remaining(ctx context.Context, q pg.Querier, id int64) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, query("RemainingOf"), id).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting what campaign %d has left: %w", id, err)
	}
	return n, nil
}

// Get reads a campaign's status.
func Get(ctx context.Context, q pg.Querier, id int64) (Status, error) {
	rows, err := q.Query(ctx, query("Status"), id)
	if err != nil {
		return Status{}, fmt.Errorf("reading campaign %d: %w", id, err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByPos[Status])
	if errors.Is(err, pgx.ErrNoRows) {
		err = ErrNotFound
	}
	if err != nil {
		return Status{}, fmt.Errorf("reading campaign %d: %w", id, err)
	}
	return s, nil
}

// Find returns the id of the campaign of tenant named name (ok false: none).
func Find(ctx context.Context, q pg.Querier, tenant, name string) (id int64, ok bool, err error) {
	err = q.QueryRow(ctx, query("Find"), tenant, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("finding campaign %q of tenant %q: %w", name, tenant, err)
	}
	return id, true, nil
}
