package campaign

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

//go:embed queries.sql
var queriesSQL string

var queries = sqlfile.Parse("queries.sql", queriesSQL)

func query(name string) string { return queries.Get(name) }

// Channel is the pseudo-channel of planning commands (broker.PlanChannel).
const Channel = broker.PlanChannel

// Topology is the broker topology of the planning queue under prefix
// (broker.Topology.Planning).
func Topology(prefix string) broker.Topology {
	return broker.Topology{Prefix: prefix}.Planning()
}

// Errors of the planner.
var (
	// ErrPoison: the command cannot be verified or is not a planning
	// command; it is dead-lettered, never processed.
	ErrPoison = errors.New("planning command rejected")
	// ErrDeferred: the planner is stopping and gave the command back.
	ErrDeferred = errors.New("planning command deferred")
)

// Planner plans campaign slices from planning commands.
type Planner struct {
	// Pool connects as a login of nudge_planner (or the owner).
	Pool *pgxpool.Pool
	// Keys verify commands and sign continuations (a "plan" channel key is enough).
	Keys *message.Keyring
	// Publisher publishes continuations, with confirms, on Topology.
	Publisher *broker.Publisher
	Topology  broker.Topology
	Clock     clock.Clock
	// Name identifies this planner in the checkpoint log.
	Name string
	Log  zerolog.Logger
	// StopBy, when set, is when the planner must have stopped (a SIGTERM's
	// grace period): no slice starts that its lease could carry past it.
	StopBy func() time.Time
	// Metrics records each command's outcome (nil: none; observe.go).
	Metrics *metrics.Planner
	// SliceSize is the slice of campaigns that set none (zero: DefaultSliceSize).
	SliceSize int
}

// Slice sizes: the default of a campaign that sets none, and the bounds of
// any (the schema's CHECK on campaigns.slice_size).
const (
	DefaultSliceSize = 200
	MinSliceSize     = 1
	MaxSliceSize     = 10000
)

// CheckSliceSize refuses a slice size out of bounds, naming what was expected.
func CheckSliceSize(n int) error {
	if n < MinSliceSize || n > MaxSliceSize {
		return fmt.Errorf("slice size %d is out of range: want %d to %d audience rows", n, MinSliceSize, MaxSliceSize)
	}
	return nil
}

// Command is a planning command: plan campaign ID at fence Fence.
type Command struct {
	ID, Fence int64
	Tenant    string
	Deadline  time.Time
}

func (c Command) envelope(now time.Time) message.Envelope {
	return message.Envelope{ReminderID: c.ID, Fence: c.Fence, Channel: Channel, Tenant: c.Tenant,
		Deadline: c.Deadline, IdempotencyKey: fmt.Sprintf("campaign:%d:fence:%d", c.ID, c.Fence), FirstSeen: now}
}

// Publish sends planning commands and waits for the broker's confirmations.
func Publish(ctx context.Context, pub *broker.Publisher, topo broker.Topology, keys *message.Keyring,
	now time.Time, cmds ...Command) error {
	msgs := make([]broker.Outgoing, len(cmds))
	for i, c := range cmds {
		body, headers, err := keys.Seal(c.envelope(now))
		if err != nil {
			return fmt.Errorf("signing the planning command of campaign %d: %w", c.ID, err)
		}
		msgs[i] = broker.Outgoing{Exchange: topo.WorkExchange(), RoutingKey: Channel, Msg: amqp.Publishing{
			MessageId: strconv.Itoa(i), ContentType: "application/json", DeliveryMode: amqp.Persistent,
			Timestamp: now, Headers: headers, Body: body,
		}}
	}
	errs, err := pub.PublishBatch(ctx, msgs)
	if err != nil {
		return fmt.Errorf("publishing %d planning commands: %w", len(cmds), err)
	}
	return errors.Join(errs...)
}

// Nudge is the cron part: it publishes one planning command for every
// campaign still planning, at its current fence. A campaign whose chain of
// commands is alive gets a duplicate, which the fence drops; one whose chain
// broke (a planner killed between its commit and its publish) resumes.
func Nudge(ctx context.Context, pool *pgxpool.Pool, pub *broker.Publisher, topo broker.Topology,
	keys *message.Keyring, now time.Time) (int, error) {
	rows, err := pool.Query(ctx, query("Runnable"))
	if err != nil {
		return 0, fmt.Errorf("listing runnable campaigns: %w", err)
	}
	cmds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Command, error) {
		var c Command
		err := r.Scan(&c.ID, &c.Tenant, &c.Deadline, &c.Fence)
		return c, err
	})
	if err != nil || len(cmds) == 0 {
		return 0, err
	}
	return len(cmds), Publish(ctx, pub, topo, keys, now, cmds...)
}

// campaignRow is the locked campaign.
type campaignRow struct {
	id               int64
	tenant, template string
	channel          reminder.Channel
	dueAt            *time.Time
	daysBefore       *int
	deadline         time.Time
	sliceSize        *int // nil: the planner's
	leaseSeconds     float64
	state            State
	cursor           *string
	fence, continued int64
	updatedAt        time.Time
	// The local due rules: a wall time (its UTC fields), or days_before at
	// a time of day (seconds after midnight); the zone of rows without one.
	dueLocal           *time.Time
	atLocal            *int
	defaultZone        string
	shadow, shadowKeys bool
	enabled            bool
	size               int // the slice size in force
}

func (c campaignRow) snapshot() Snapshot {
	return Snapshot{State: c.state, Deadline: c.deadline, Lease: time.Duration(c.leaseSeconds * float64(time.Second)),
		Fence: c.fence, Continued: c.continued, UpdatedAt: c.updatedAt, Enabled: c.enabled}
}

// Handle verifies one delivery's body and runs its command. An error
// wrapping ErrPoison means dead-letter it; any other error, give it back.
func (p *Planner) Handle(ctx context.Context, body []byte, headers map[string]any) (Decision, error) {
	env, err := p.Keys.Open(body, headers)
	if err != nil {
		return Decision{}, fmt.Errorf("%w: %w", ErrPoison, err)
	}
	if env.Channel != Channel {
		return Decision{}, fmt.Errorf("%w: channel %q is not %q", ErrPoison, env.Channel, Channel)
	}
	return p.Step(ctx, Command{ID: env.ReminderID, Fence: env.Fence, Tenant: env.Tenant, Deadline: env.Deadline})
}

// Step runs one planning command: at most one slice in one transaction, then
// the continuation. It returns what was decided.
func (p *Planner) Step(ctx context.Context, cmd Command) (Decision, error) {
	tx, err := p.Pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return Decision{}, fmt.Errorf("planning campaign %d: %w", cmd.ID, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after commit
	var c campaignRow
	err = tx.QueryRow(ctx, query("Lock"), cmd.ID).Scan(&c.id, &c.tenant, &c.channel, &c.template, &c.dueAt,
		&c.daysBefore, &c.deadline, &c.sliceSize, &c.leaseSeconds, &c.state, &c.cursor, &c.fence, &c.continued, &c.updatedAt,
		&c.dueLocal, &c.atLocal, &c.defaultZone, &c.shadow, &c.shadowKeys, &c.enabled)
	if errors.Is(err, pgx.ErrNoRows) {
		return Decision{Drop, "no such campaign"}, nil
	}
	if err != nil {
		return Decision{}, fmt.Errorf("locking campaign %d: %w", cmd.ID, err)
	}
	c.size = p.SliceSize
	if c.sliceSize != nil {
		c.size = *c.sliceSize
	}
	if c.size <= 0 {
		c.size = DefaultSliceSize
	}
	now := p.Clock.Now()
	timeLeft := time.Duration(-1)
	if p.StopBy != nil {
		timeLeft = max(p.StopBy().Sub(now), 0)
	}
	d := Decide(c.snapshot(), cmd.Fence, now, timeLeft)
	log := p.Log.With().Int64("campaign", c.id).Int64("fence", c.fence).Int64("command_fence", cmd.Fence).
		Stringer("verdict", d.Verdict).Str("reason", d.Reason).Logger()
	switch d.Verdict {
	case Drop:
		log.Debug().Msg("planning command dropped")
		return d, nil
	case Defer:
		return d, fmt.Errorf("%w: %s", ErrDeferred, d.Reason)
	case Republish:
		if err := tx.Rollback(ctx); err != nil {
			return d, fmt.Errorf("planning campaign %d: %w", c.id, err)
		}
		log.Info().Msg("republishing a lost continuation")
		return d, p.continueAt(ctx, c, c.fence)
	case EndLate:
		return d, p.endLate(ctx, tx, c, now, log)
	}
	next, err := p.planSlice(ctx, tx, c, now, log)
	if err != nil {
		return d, err
	}
	if next == nil {
		return d, nil
	}
	return d, p.continueAt(ctx, c, *next)
}

func (p *Planner) continueAt(ctx context.Context, c campaignRow, fence int64) error {
	now := p.Clock.Now()
	if err := Publish(ctx, p.Publisher, p.Topology, p.Keys, now,
		Command{ID: c.id, Fence: fence, Tenant: c.tenant, Deadline: c.deadline}); err != nil {
		return err
	}
	p.Metrics.LeaseExtended()
	if _, err := p.Pool.Exec(ctx, query("Continued"), c.id, fence); err != nil {
		return fmt.Errorf("recording the continuation of campaign %d: %w", c.id, err)
	}
	return nil
}

func (p *Planner) endLate(ctx context.Context, tx pgx.Tx, c campaignRow, now time.Time, log zerolog.Logger) error {
	var remaining int64
	if err := tx.QueryRow(ctx, query("Remaining"), c.id, c.cursor).Scan(&remaining); err != nil {
		return fmt.Errorf("counting what campaign %d left unplanned: %w", c.id, err)
	}
	if _, err := tx.Exec(ctx, query("EndLate"), c.id, c.fence, remaining, now); err != nil {
		return fmt.Errorf("ending campaign %d late: %w", c.id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("ending campaign %d late: %w", c.id, err)
	}
	log.Warn().Int64("unplanned", remaining).Msg("campaign ended late")
	return nil
}

// planSlice reads, schedules and checkpoints one slice, and commits. It
// returns the fence to continue at, nil when the campaign is done.
func (p *Planner) planSlice(ctx context.Context, tx pgx.Tx, c campaignRow, now time.Time, log zerolog.Logger) (*int64, error) {
	lease := strconv.FormatInt(int64(c.leaseSeconds*1000), 10) + "ms"
	if _, err := tx.Exec(ctx, query("Timeouts"), lease); err != nil {
		return nil, fmt.Errorf("bounding slice %d of campaign %d: %w", c.fence+1, c.id, err)
	}
	// The test of issue 15 counts these lines against the checkpoint log.
	log.Info().Int64("slice", c.fence+1).Str("planner", p.Name).Msg("reading slice")
	rows, err := tx.Query(ctx, query("Audience"), c.id, c.cursor, c.size)
	if err != nil {
		return nil, fmt.Errorf("reading slice %d of campaign %d: %w", c.fence+1, c.id, err)
	}
	aud, err := pgx.CollectRows(rows, pgx.RowToStructByPos[audienceRow])
	if err != nil {
		return nil, fmt.Errorf("reading slice %d of campaign %d: %w", c.fence+1, c.id, err)
	}
	s := buildSlice(c, aud)
	outs, err := p.schedule(ctx, tx, c, s.reqs)
	if err != nil {
		return nil, fmt.Errorf("scheduling slice %d of campaign %d: %w", c.fence+1, c.id, err)
	}
	intents := 0
	var planned []string
	for i, o := range outs {
		switch {
		case o.Err == nil:
			intents++
			planned = append(planned, s.reqKeys[i])
		case errors.Is(o.Err, intake.ErrConcurrent):
			// Someone else wrote one of this campaign's keys at this very
			// moment: roll the slice back, the command is redelivered.
			return nil, fmt.Errorf("scheduling slice %d of campaign %d: %w", c.fence+1, c.id, o.Err)
		default:
			s.badKeys, s.badReasons = append(s.badKeys, s.reqKeys[i]), append(s.badReasons, o.Err.Error())
		}
	}
	if len(s.badKeys) > 0 {
		if _, err := tx.Exec(ctx, query("BadRows"), c.id, s.badKeys, s.badReasons, now); err != nil {
			return nil, fmt.Errorf("recording bad rows of campaign %d: %w", c.id, err)
		}
	}
	if c.shadowKeys && len(planned) > 0 {
		if _, err := tx.Exec(ctx, query("ShadowKeys"), c.id, planned, c.fence+1); err != nil {
			return nil, fmt.Errorf("recording the shadow keys of campaign %d: %w", c.id, err)
		}
	}
	to := c.cursor
	if len(aud) > 0 {
		to = &aud[len(aud)-1].Key
	}
	done := len(aud) < c.size
	took := p.Clock.Now().Sub(now).Milliseconds()
	if _, err := tx.Exec(ctx, query("Checkpoint"), c.id, c.fence+1, c.cursor, to, len(aud), intents,
		len(s.badKeys), p.Name, now, took); err != nil {
		return nil, fmt.Errorf("checkpointing slice %d of campaign %d: %w", c.fence+1, c.id, err)
	}
	tag, err := tx.Exec(ctx, query("Advance"), c.id, c.fence, to, intents, len(s.badKeys), done, now)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("the campaign's fence moved") // impossible under the row lock; never commit it
	}
	if err != nil {
		return nil, fmt.Errorf("advancing campaign %d past slice %d: %w", c.id, c.fence+1, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("committing slice %d of campaign %d: %w", c.fence+1, c.id, err)
	}
	log.Info().Int64("slice", c.fence+1).Int("rows", len(aud)).Int("intents", intents).
		Int("bad", len(s.badKeys)).Bool("done", done).Bool("shadow", c.shadow).Int64("took_ms", took).Msg("slice planned")
	if done {
		return nil, nil
	}
	next := c.fence + 1
	return &next, nil
}

// schedule runs the bulk intake statement for a slice's requests. A shadow
// campaign runs it inside a savepoint it then rolls back: the outcomes (and
// so the counts) are the ones a real run would get, and no reminder remains.
func (p *Planner) schedule(ctx context.Context, tx pgx.Tx, c campaignRow, reqs []intake.Request) ([]intake.Outcome, error) {
	if !c.shadow {
		return intake.ScheduleMany(ctx, tx, reqs)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, err
	}
	outs, err := intake.ScheduleMany(ctx, sp, reqs)
	if rerr := sp.Rollback(ctx); err == nil && rerr != nil {
		err = rerr
	}
	return outs, err
}

// audienceRow is one row of nudge_campaign_audience.
type audienceRow struct {
	Key       string
	Recipient *string
	Data      []byte
	// Date is the date column as an instant; Day, its calendar day when the
	// column is a date (NULL for a timestamptz column).
	Date *time.Time
	Day  *time.Time
	Zone *string
}

type slice struct {
	reqs                []intake.Request
	reqKeys             []string
	badKeys, badReasons []string
}

// buildSlice turns audience rows into intake requests, and the rows the due
// rule cannot place into bad rows.
func buildSlice(c campaignRow, aud []audienceRow) slice {
	var s slice
	zones := zoneCache{} // at most a slice's rows
	for _, a := range aud {
		r, reason := c.request(a, zones)
		if reason != "" {
			s.badKeys, s.badReasons = append(s.badKeys, a.Key), append(s.badReasons, reason)
			continue
		}
		s.reqs = append(s.reqs, r)
		s.reqKeys = append(s.reqKeys, a.Key)
	}
	return s
}

// request is the reminder of audience row a under the campaign's due rule,
// or why there is none. A row's zone is its zone column, or the campaign's
// default zone when that is NULL or empty; a local wall time is handed to
// intake with the zone, which resolves it (pkg/localtime's rules).
func (c campaignRow) request(a audienceRow, zones zoneCache) (intake.Request, string) {
	r := intake.Request{Tenant: c.tenant, Key: fmt.Sprintf("campaign:%d:%s", c.id, a.Key), Channel: c.channel,
		Recipient: deref(a.Recipient), Template: c.template, Deadline: c.deadline}
	if len(a.Data) > 0 && string(a.Data) != "null" {
		r.Data = json.RawMessage(a.Data)
	}
	local := c.dueLocal != nil || c.atLocal != nil
	var loc *time.Location
	if zone := deref(a.Zone); local || zone != "" {
		if zone == "" {
			zone = c.defaultZone
		}
		var err error
		if loc, err = zones.load(zone); err != nil {
			return r, fmt.Sprintf("field %q %s", "zone", err)
		}
		r.TZ = zone
	}
	switch {
	case c.dueAt != nil:
		r.DueAt = *c.dueAt
	case c.dueLocal != nil:
		r.DueLocal = localtime.WallOf(c.dueLocal.UTC()).String()
	case a.Date == nil:
		return r, "the date column is empty"
	case c.atLocal == nil:
		r.DueAt = a.Date.AddDate(0, 0, -*c.daysBefore)
		if a.Date.Before(r.Deadline) {
			r.Deadline = *a.Date
		}
	default:
		// The recipient's own day: a date as it is, an instant as the day
		// it falls on in their zone. Its deadline is the start of that day
		// there (or the instant), due days_before it at at_local.
		var y int
		var m time.Month
		var d int
		ends := *a.Date
		if a.Day != nil {
			y, m, d = a.Day.UTC().Date()
			ends = localtime.Resolve(localtime.Wall{Year: y, Month: m, Day: d}, loc)
		} else {
			y, m, d = a.Date.In(loc).Date()
		}
		at := *c.atLocal
		r.DueLocal = localtime.Wall{Year: y, Month: m, Day: d - *c.daysBefore,
			Hour: at / 3600, Minute: at / 60 % 60, Second: at % 60}.String()
		if ends.Before(r.Deadline) {
			r.Deadline = ends
		}
	}
	return r, ""
}

// zoneCache remembers LoadZone's answers (it reads the zone database).
type zoneCache map[string]struct {
	loc *time.Location
	err error
}

func (z zoneCache) load(name string) (*time.Location, error) {
	if e, ok := z[name]; ok {
		return e.loc, e.err
	}
	loc, err := localtime.LoadZone(name)
	z[name] = struct {
		loc *time.Location
		err error
	}{loc, err}
	return loc, err
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
