// Package store holds every state transition the dispatcher, workers and
// reconciler make, as batched, fenced SQL statements (queries.sql). The
// database is the source of truth: a transition that finds the row moved on
// (another fence, another state) changes nothing and says so by omission from
// its result, and the caller treats that as "someone else owns it now".
package store

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

//go:embed queries.sql
var queriesSQL string

var queries = sqlfile.Parse("queries.sql", queriesSQL)

func query(name string) string { return queries.Get(name) }

// Store runs the transitions against a pool.
type Store struct {
	pool *pgxpool.Pool
	// channel, when set, binds the statements a worker settles queued
	// reminders with (Quarantine, ExpireFenced, ExpireEarly) to rows of that
	// channel, as ClaimForDelivery is: a worker holding a message that names
	// another channel's reminder cannot move it (ForChannel).
	channel reminder.Channel
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// ForChannel returns a Store on the same pool whose worker statements touch
// only reminders of channel c.
func (s *Store) ForChannel(c reminder.Channel) *Store {
	cp := *s
	cp.channel = c
	return &cp
}

// Pool returns the underlying pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Fenced names a reminder together with the fence its holder expects.
type Fenced struct {
	ID    int64
	Fence int64
}

// Claimed is a reminder that a claim enqueued (or expired, or quarantined)
// for its caller.
type Claimed struct {
	ID       int64
	State    reminder.State
	Fence    int64
	Channel  reminder.Channel
	Tenant   string
	Deadline time.Time
	Attempts int
	DueAt    time.Time
	// Batch numbers the claim statement that enqueued it (zero for rows it
	// did not enqueue); its publish confirmation is recorded per batch.
	Batch int64
	// ClaimedAt is the claim's time (its @now).
	ClaimedAt time.Time
	// From is the state Reclaim took it from (empty for ClaimDue's):
	// Sending means its send lease had expired.
	From reminder.State
	// Code is the transition ClaimDue made (claimed, deadline_before_dispatch,
	// window_closed, no_window_before_deadline); empty from Reclaim.
	Code reminder.Code
}

// scanClaimed scans a Claimed from the columns ClaimDue and Reclaim both
// return, then the extra columns into extra.
func scanClaimed(r pgx.CollectableRow, now time.Time, extra ...any) (Claimed, error) {
	c := Claimed{ClaimedAt: now}
	var batch *int64
	err := r.Scan(append([]any{&c.ID, &c.State, &c.Fence, &c.Channel, &c.Tenant, &c.Deadline,
		&c.Attempts, &c.DueAt, &batch}, extra...)...)
	if batch != nil && c.State == reminder.Enqueued {
		c.Batch = *batch
	}
	return c, err
}

// ClaimDue enqueues, under a dispatch lease until now+lease and one batch
// number, up to limit pending reminders due at or before cutoff, skipping
// rows another claimer holds: an even part from every tenant with due rows,
// each tenant's in due order. Reminders already at or past their deadline are
// expired instead and returned with State Expired. A reminder whose send
// window is closed at now stays pending, due at the window's next opening
// (returned with State Pending, DueAt the opening, Code CodeWindowClosed),
// or is expired (Code CodeNoWindowBeforeDeadline) when that opening is at or
// after its deadline. The caller publishes the
// enqueued ones and records the batch's confirmation (ConfirmPublished) or
// releases what was not confirmed (Release).
func (s *Store) ClaimDue(ctx context.Context, now, cutoff time.Time, limit int, lease time.Duration, actor string) ([]Claimed, error) {
	out, _, err := s.ClaimDueBatch(ctx, now, cutoff, limit, lease, actor)
	return out, err
}

// ClaimDueBatch is ClaimDue that also says whether due rows may be left: a
// batch is short both when nothing more is due and when one tenant ran out
// before the others, so its length alone cannot tell.
func (s *Store) ClaimDueBatch(ctx context.Context, now, cutoff time.Time, limit int, lease time.Duration, actor string) (claimed []Claimed, more bool, err error) {
	rows, err := s.pool.Query(ctx, query("ClaimDue"), named{
		"now": now, "cutoff": cutoff, "limit": limit, "lease_until": now.Add(lease), "actor": actor,
	})
	if err != nil {
		return nil, false, fmt.Errorf("claiming due reminders: %w", err)
	}
	claimed, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Claimed, error) {
		var code string
		c, err := scanClaimed(r, now, &more, &code)
		c.Code = reminder.Code(code)
		return c, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("claiming due reminders: %w", err)
	}
	return claimed, more || len(claimed) == limit, nil
}

// MaxRepublishes bounds how often the reconciler republishes one reminder;
// the next time it is quarantined instead.
const MaxRepublishes = 3

// Reclaim enqueues again, under a new fence, a dispatch lease and a batch
// number, as ClaimDue does, up to limit reminders whose
// message is overdue (enqueued or retrying longer than overdue ago) or whose
// send lease expired, so they can be published again. One republished
// MaxRepublishes times already is quarantined instead (State Quarantined).
func (s *Store) Reclaim(ctx context.Context, now time.Time, overdue time.Duration, limit int, lease time.Duration, actor string) ([]Claimed, error) {
	return s.ReclaimExcept(ctx, now, overdue, limit, lease, actor, nil)
}

// ReclaimExcept is Reclaim that leaves the enqueued and retrying reminders
// of the waiting channels alone (their messages wait in a queue with a
// backlog or no consumer: not lost, and republishing them would only spend
// their MaxRepublishes budget); their sending ones with an expired send
// lease are still reclaimed.
func (s *Store) ReclaimExcept(ctx context.Context, now time.Time, overdue time.Duration, limit int, lease time.Duration, actor string, waiting []string) ([]Claimed, error) {
	rows, err := s.pool.Query(ctx, query("Reclaim"), pgx.NamedArgs{
		"now": now, "overdue_before": now.Add(-overdue), "limit": limit, "lease_until": now.Add(lease), "actor": actor,
		"max_republishes": MaxRepublishes, "waiting": append([]string{}, waiting...),
	})
	if err != nil {
		return nil, fmt.Errorf("reclaiming stuck reminders: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Claimed, error) {
		var from reminder.State
		c, err := scanClaimed(r, now, &from)
		c.From = from
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("reclaiming stuck reminders: %w", err)
	}
	return out, nil
}

// split returns the ids and fences of fs, in id order: every batched
// statement locks its rows in the order it is given them, so two writers on
// overlapping rows (the dispatcher recording enqueued while a worker claims
// the messages that overtook that record) wait for each other instead of
// deadlocking, which would cost one of them deadlock_timeout and a retry.
func split(fs []Fenced) (ids, fences []int64) {
	ids, fences = make([]int64, len(fs)), make([]int64, len(fs))
	for i, f := range byID(fs, func(f Fenced) int64 { return f.ID }) {
		ids[i], fences[i] = f.ID, f.Fence
	}
	return ids, fences
}

// byID returns a copy of xs in id order. Every batched statement is handed
// its rows in this order (see split).
func byID[T any](xs []T, id func(T) int64) []T {
	return slices.SortedFunc(slices.Values(xs), func(a, b T) int { return cmp.Compare(id(a), id(b)) })
}

func (s *Store) ids(ctx context.Context, op, name string, args pgx.NamedArgs) (map[int64]bool, error) {
	rows, err := s.pool.Query(ctx, query(name), named(args))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	out := make(map[int64]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

// ConfirmPublished records that the broker confirmed the messages of each
// batch (confirmed[b] of them; the others were released): one row per batch.
func (s *Store) ConfirmPublished(ctx context.Context, now time.Time, confirmed map[int64]int, actor string) error {
	batches, counts := make([]int64, 0, len(confirmed)), make([]int32, 0, len(confirmed))
	for b, n := range confirmed {
		batches, counts = append(batches, b), append(counts, int32(n))
	}
	_, err := s.pool.Exec(ctx, query("ConfirmPublished"), named{
		"now": now, "batches": batches, "confirmed": counts, "actor": actor,
	})
	if err != nil {
		return fmt.Errorf("recording publish confirmations of batches %v: %w", batches, err)
	}
	return nil
}

// Release returns enqueued reminders whose publish was not confirmed to
// pending under a new fence (and leased ones, claimed by a dispatcher of
// schema version 6 or earlier during a rollout).
func (s *Store) Release(ctx context.Context, now time.Time, fs []Fenced, actor, reason string) (map[int64]bool, error) {
	ids, fences := split(fs)
	return s.ids(ctx, "releasing unconfirmed claims", "Release", pgx.NamedArgs{
		"now": now, "ids": ids, "fences": fences, "actor": actor, "reason": reason,
	})
}

// ResolveExpiredLeases resolves up to limit dispatch leases that ran out:
// an enqueued reminder whose batch's publish was confirmed keeps its state
// (cleared counts them); one whose publish was not, or a leased one (claimed
// by a dispatcher before schema version 7), returns to pending under a new
// fence (released counts them).
func (s *Store) ResolveExpiredLeases(ctx context.Context, now time.Time, limit int, actor string) (released, cleared int, err error) {
	err = s.pool.QueryRow(ctx, query("ResolveExpiredLeases"), pgx.NamedArgs{
		"now": now, "limit": limit, "actor": actor,
	}).Scan(&released, &cleared)
	if err != nil {
		return 0, 0, fmt.Errorf("resolving expired dispatch leases: %w", err)
	}
	return released, cleared, nil
}

// ExpireOverdue expires up to limit open reminders at or past their deadline
// (not those being sent under a live lease), and says how many.
func (s *Store) ExpireOverdue(ctx context.Context, now time.Time, limit int, actor string) (int, error) {
	exp, err := s.ExpireOverdueByChannel(ctx, now, limit, actor)
	n := 0
	for _, e := range exp {
		n += e.Expired
	}
	return n, err
}

// Expiry counts what ExpireOverdue ended in one channel.
type Expiry struct {
	// Expired reminders, of which SendLeaseExpired were being sent under a
	// send lease that had run out (their worker is presumed gone).
	Expired, SendLeaseExpired int
}

// ExpireOverdueByChannel is ExpireOverdue that says how many per channel.
func (s *Store) ExpireOverdueByChannel(ctx context.Context, now time.Time, limit int, actor string) (map[reminder.Channel]Expiry, error) {
	return s.ExpireOverdueHolding(ctx, now, limit, actor, Hold{})
}

// ExpireOverdueHolding is ExpireOverdueByChannel that leaves alone the
// reminders hold keeps for a lookup (UnknownAtDeadline).
func (s *Store) ExpireOverdueHolding(ctx context.Context, now time.Time, limit int, actor string, hold Hold) (map[reminder.Channel]Expiry, error) {
	rows, err := s.pool.Query(ctx, query("ExpireOverdue"), pgx.NamedArgs{"now": now, "limit": limit, "actor": actor,
		"hold_channels": hold.channels(), "hold_for": hold.For, "looked": nonNil(hold.Looked)})
	if err != nil {
		return nil, fmt.Errorf("expiring overdue reminders: %w", err)
	}
	out := map[reminder.Channel]Expiry{}
	var ch reminder.Channel
	var e Expiry
	if _, err := pgx.ForEachRow(rows, []any{&ch, &e.Expired, &e.SendLeaseExpired}, func() error {
		out[ch] = e
		return nil
	}); err != nil {
		return nil, fmt.Errorf("expiring overdue reminders: %w", err)
	}
	return out, nil
}

// Quarantine parks reminders whose message keeps failing, for the fences
// given: quarantined until an operator replays or expires them.
func (s *Store) Quarantine(ctx context.Context, now time.Time, fs []Fenced, actor, reason string) (map[int64]bool, error) {
	return s.settle(ctx, "quarantining reminders", now, fs, reminder.CodePoisonMessage, actor, reason)
}

// settle moves reminders a worker holds the message of, still waiting for it
// at the given fences (leased, enqueued or retrying), where code leads
// (reminder.Transitions), with one statement for every such code.
func (s *Store) settle(ctx context.Context, op string, now time.Time, fs []Fenced, code reminder.Code, actor, reason string) (map[int64]bool, error) {
	to, err := reminder.Target(reminder.Worker, code, reminder.Leased, reminder.Enqueued, reminder.Retrying)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	ids, fences := split(fs)
	return s.ids(ctx, op, "SettleQueued", pgx.NamedArgs{
		"now": now, "ids": ids, "fences": fences, "actor": actor, "reason": reason,
		"state": string(to), "code": string(code), "deadline_reached": code == reminder.CodeDeadlineBeforeSend,
		"channel": string(s.channel),
	})
}

// Defer records that messages were handed back to wait for capacity, each
// until its turn (untils[i] for fs[i]): enqueued rows restart their overdue
// clock there, retrying ones move their next attempt time there.
func (s *Store) Defer(ctx context.Context, now time.Time, fs []Fenced, untils []time.Time) (map[int64]bool, error) {
	if len(untils) != len(fs) {
		return nil, fmt.Errorf("deferring reminders: %d untils for %d reminders", len(untils), len(fs))
	}
	type row struct {
		f     Fenced
		until time.Time
	}
	rows := make([]row, len(fs))
	for i := range fs {
		rows[i] = row{fs[i], untils[i]}
	}
	ids, fences, sorted := make([]int64, len(rows)), make([]int64, len(rows)), make([]time.Time, len(rows))
	for i, r := range byID(rows, func(r row) int64 { return r.f.ID }) {
		ids[i], fences[i], sorted[i] = r.f.ID, r.f.Fence, r.until
	}
	return s.ids(ctx, "deferring reminders", "Defer", pgx.NamedArgs{
		"now": now, "untils": sorted, "ids": ids, "fences": fences,
	})
}

// ExpireEarly expires leased, enqueued or retrying reminders at the given
// fences now, before their deadline, because nothing can be sent in time (no
// capacity before it).
func (s *Store) ExpireEarly(ctx context.Context, now time.Time, fs []Fenced, actor, reason string) (map[int64]bool, error) {
	return s.settle(ctx, "expiring reminders early", now, fs, reminder.CodeNoCapacity, actor, reason)
}

// Delivery is what a worker needs to decide about and send one reminder.
type Delivery struct {
	ID             int64
	Tenant         string
	Channel        reminder.Channel
	Recipient      string
	Template       string
	Data           map[string]any
	DueAt          time.Time
	Deadline       time.Time
	IdempotencyKey string
	State          reminder.State
	Fence          int64
	Attempts       int
	// NextAttemptAt is when a retrying reminder may be tried again (zero:
	// not set). ClaimForDelivery never claims a retrying row before it.
	NextAttemptAt time.Time
	// TZ is the recipient's zone as stored ("": UTC).
	TZ string
	// Zone is TZ loaded (UTC for ""), or nil when this binary's zone
	// database does not know it.
	Zone *time.Location
	// Window is the send window that applies: the reminder's own, else its
	// tenant's policy for the channel, else the default. ClaimForDelivery
	// never claims a row whose window is closed.
	Window localtime.Window
}

// deliveryScan reads the rows of LoadForDelivery and ClaimForDelivery into
// destinations built once per statement and reused row by row: built per
// row, the slice of destinations and each nullable column's pointer escaped
// to the heap: 6 allocations a row (BenchmarkLoadForDelivery), and the
// claim's 3 attempt columns.
type deliveryScan struct {
	d                 Delivery
	data              []byte
	next              *time.Time
	open, close, days *int32
	dest              []any
}

// newDeliveryScan reads the columns both statements start with, then the
// extra columns into extra.
func newDeliveryScan(extra ...any) *deliveryScan {
	s := &deliveryScan{}
	d := &s.d
	s.dest = append([]any{&d.ID, &d.Tenant, &d.Channel, &d.Recipient, &d.Template, &s.data, &d.DueAt, &d.Deadline,
		&d.IdempotencyKey, &d.State, &d.Fence, &d.Attempts, &s.next, &d.TZ, &s.open, &s.close, &s.days}, extra...)
	return s
}

// scan reads the current row: a Delivery of its own (nothing of an earlier
// row's is left in it), the extra columns into newDeliveryScan's extra.
func (s *deliveryScan) scan(r pgx.Row) (Delivery, error) {
	s.d, s.data, s.next, s.open, s.close, s.days = Delivery{}, nil, nil, nil, nil, nil
	if err := r.Scan(s.dest...); err != nil {
		return Delivery{}, err
	}
	d := s.d
	if s.next != nil {
		d.NextAttemptAt = *s.next
	}
	w, err := reminder.StoredWindow(s.open, s.close, s.days)
	if err != nil {
		return Delivery{}, fmt.Errorf("reminder %d: %w", d.ID, err)
	}
	if w != nil {
		d.Window = *w
	}
	d.Zone = zone(d.TZ)
	if err := json.Unmarshal(s.data, &d.Data); err != nil {
		return Delivery{}, fmt.Errorf("reminder %d data: %w", d.ID, err)
	}
	return d, nil
}

// LoadForDelivery reads the current rows of the given reminders.
func (s *Store) LoadForDelivery(ctx context.Context, ids []int64) (map[int64]Delivery, error) {
	rows, err := s.pool.Query(ctx, query("LoadForDelivery"), pgx.NamedArgs{"ids": ids})
	if err != nil {
		return nil, fmt.Errorf("reading reminders for delivery: %w", err)
	}
	sc := newDeliveryScan()
	ds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) { return sc.scan(r) })
	if err != nil {
		return nil, fmt.Errorf("reading reminders for delivery: %w", err)
	}
	out := make(map[int64]Delivery, len(ds))
	for _, d := range ds {
		out[d.ID] = d
	}
	return out, nil
}

// Attempt is a claimed send attempt.
type Attempt struct {
	ReminderID int64
	// Fence is the reminder's new fence, held for the duration of the send.
	Fence     int64
	Number    int
	AttemptID int64
}

// ClaimAttempts moves the given reminders from enqueued or retrying to
// sending, each only while it still has the given fence, is due and is
// before its deadline at now. It returns the attempts it claimed by reminder
// id. It claims each reminder under its own channel, whatever that is: it is
// for tests and tools; a worker claims with ClaimForDelivery, bound to its
// channel.
func (s *Store) ClaimAttempts(ctx context.Context, now time.Time, fs []Fenced, lease time.Duration, actor string) (map[int64]Attempt, error) {
	ids, _ := split(fs)
	rows, err := s.LoadForDelivery(ctx, ids)
	if err != nil {
		return nil, err
	}
	byChannel := map[reminder.Channel][]Fenced{}
	for _, f := range fs {
		if r, ok := rows[f.ID]; ok {
			byChannel[r.Channel] = append(byChannel[r.Channel], f)
		}
	}
	out := map[int64]Attempt{}
	for channel, fs := range byChannel {
		_, claimed, err := s.ClaimForDelivery(ctx, now, channel, "", fs, lease, actor)
		if err != nil {
			return nil, err
		}
		maps.Copy(out, claimed)
	}
	return out, nil
}

// ClaimForDelivery is LoadForDelivery and ClaimAttempts in one statement:
// it claims, as ClaimAttempts does, every given reminder of channel that
// still has the given fence, is due and is before its deadline at now, and
// returns every given reminder that exists as it was before the claim (by
// id), with the attempts it claimed (by reminder id). A row returned without
// an attempt was not claimed: the caller judges from the row why. A
// reminder of another channel is never claimed: a worker acts only on its
// own channel's work, whatever a message names. provider names the provider
// the attempts are to be sent through (delivery_attempts.provider; "" for
// none known): an attempt whose outcome turns out unknown is looked up there.
func (s *Store) ClaimForDelivery(ctx context.Context, now time.Time, channel reminder.Channel, provider string, fs []Fenced, lease time.Duration, actor string) (map[int64]Delivery, map[int64]Attempt, error) {
	if !channel.Valid() {
		return nil, nil, fmt.Errorf("claiming reminders for delivery: channel %q: must be email, sms or webhook", channel)
	}
	ids, fences := split(fs)
	rows, err := s.pool.Query(ctx, query("ClaimForDelivery"), named{
		"now": now, "channel": string(channel), "provider": provider, "ids": ids, "fences": fences,
		"lease_until": now.Add(lease), "actor": actor,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("claiming reminders for delivery: %w", err)
	}
	defer rows.Close()
	out := make(map[int64]Delivery, len(fs))
	// The row of arrays (id NULL) carries the claims; the named rows leave
	// those five columns NULL (nil destinations: skipped).
	var claimedIDs, newFences, attReminders, attIDs []int64
	var numbers []int32
	sc := newDeliveryScan(nil, nil, nil, nil, nil)
	claims := append(make([]any, len(sc.dest)-5, len(sc.dest)), &claimedIDs, &newFences, &numbers, &attReminders, &attIDs)
	for rows.Next() {
		if rows.RawValues()[0] == nil {
			if err := rows.Scan(claims...); err != nil {
				return nil, nil, fmt.Errorf("claiming reminders for delivery: %w", err)
			}
			continue
		}
		d, err := sc.scan(rows)
		if err != nil {
			return nil, nil, fmt.Errorf("claiming reminders for delivery: %w", err)
		}
		out[d.ID] = d
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("claiming reminders for delivery: %w", err)
	}
	claimed, err := joinClaims(claimedIDs, newFences, numbers, attReminders, attIDs)
	if err != nil {
		return nil, nil, fmt.Errorf("claiming reminders for delivery: %w", err)
	}
	return out, claimed, nil
}

// joinClaims joins ClaimForDelivery's claims (the reminders it moved, with
// their new fences and attempt numbers) to the attempts it inserted (by
// reminder id): a claimed reminder has exactly one.
func joinClaims(ids, fences []int64, numbers []int32, attReminders, attIDs []int64) (map[int64]Attempt, error) {
	if len(fences) != len(ids) || len(numbers) != len(ids) || len(attReminders) != len(ids) || len(attIDs) != len(ids) {
		return nil, fmt.Errorf("%d claims with %d fences, %d numbers, %d attempts of %d reminders",
			len(ids), len(fences), len(numbers), len(attIDs), len(attReminders))
	}
	claimed := make(map[int64]Attempt, len(ids))
	for i, id := range ids {
		claimed[id] = Attempt{ReminderID: id, Fence: fences[i], Number: int(numbers[i])}
	}
	for i, id := range attReminders {
		a, ok := claimed[id]
		if !ok || a.AttemptID != 0 {
			return nil, fmt.Errorf("attempt %d of reminder %d: not one attempt per claimed reminder", attIDs[i], id)
		}
		a.AttemptID = attIDs[i]
		claimed[id] = a
	}
	return claimed, nil
}

// ExpireNoWindow expires leased, enqueued or retrying reminders at the
// given fences now, before their deadline, because their send window does
// not open again before it.
func (s *Store) ExpireNoWindow(ctx context.Context, now time.Time, fs []Fenced, actor, reason string) (map[int64]bool, error) {
	return s.settle(ctx, "expiring reminders with no send window before the deadline", now, fs,
		reminder.CodeNoWindowBeforeDeadline, actor, reason)
}

// zones caches the zones of the rows read: time.LoadLocation reads and
// parses a file on every call.
var zones sync.Map // string → *time.Location (nil: unknown here)

// zone returns the location of tz ("": UTC), nil when this binary's zone
// database does not know it.
func zone(tz string) *time.Location {
	if tz == "" {
		return time.UTC
	}
	if loc, ok := zones.Load(tz); ok {
		return loc.(*time.Location)
	}
	loc, err := localtime.LoadZone(tz)
	if err != nil {
		loc = nil
	}
	zones.Store(tz, loc)
	return loc
}

// ExpireFenced expires leased, enqueued or retrying reminders at the given
// fences whose deadline is at or before now.
func (s *Store) ExpireFenced(ctx context.Context, now time.Time, fs []Fenced, actor, reason string) (map[int64]bool, error) {
	return s.settle(ctx, "expiring reminders", now, fs, reminder.CodeDeadlineBeforeSend, actor, reason)
}

// Outcome is the result of one send attempt.
type Outcome struct {
	ReminderID int64
	// Fence is the attempt's fence (Attempt.Fence).
	Fence     int64
	AttemptID int64
	// Code is the reminder's transition out of sending: it decides the next
	// state (reminder.Transitions, by the worker, from sending).
	Code reminder.Code
	// Attempt is what the attempt came to.
	Attempt reminder.Outcome
	// NextAttemptAt is set with CodeRetry.
	NextAttemptAt *time.Time
	Error         string
	Reason        string
	ProviderID    string
}

// State is the state Code leads to from sending, or None when the table has
// no such transition (RecordOutcomes refuses it).
func (o Outcome) State() reminder.State {
	t, _ := reminder.Lookup(reminder.Sending, reminder.Worker, o.Code)
	return t.To
}

// RecordOutcomes records the attempts' outcomes and moves each reminder still
// sending under its attempt's fence to the state its code leads to. It
// returns the ids of the reminders it moved; an outcome missing from it lost
// its lease. An outcome whose code leads nowhere from sending, or whose
// attempt outcome is unknown, is refused (nothing is written).
func (s *Store) RecordOutcomes(ctx context.Context, now time.Time, os []Outcome, actor string) (map[int64]bool, error) {
	args, err := outcomeArgs(now, os, actor)
	if err != nil {
		return nil, fmt.Errorf("recording send outcomes: %w", err)
	}
	return s.ids(ctx, "recording send outcomes", "RecordOutcomes", args)
}

// outcomeArgs are RecordOutcomes' arguments, in reminder id order (see split).
func outcomeArgs(now time.Time, os []Outcome, actor string) (pgx.NamedArgs, error) {
	n := len(os)
	var (
		ids, fences, attemptIDs = make([]int64, n), make([]int64, n), make([]int64, n)
		states, codes, results  = make([]string, n), make([]string, n), make([]string, n)
		outcomes, errs          = make([]string, n), make([]string, n)
		reasons, provIDs        = make([]string, n), make([]string, n)
		next                    = make([]*time.Time, n)
	)
	for i, o := range byID(os, func(o Outcome) int64 { return o.ReminderID }) {
		to := o.State()
		if to == reminder.None {
			return nil, fmt.Errorf("reminder %d: no transition from sending by a worker with code %q", o.ReminderID, o.Code)
		}
		if !slices.Contains(reminder.Outcomes, o.Attempt) {
			return nil, fmt.Errorf("reminder %d: unknown attempt outcome %q", o.ReminderID, o.Attempt)
		}
		ids[i], fences[i], attemptIDs[i] = o.ReminderID, o.Fence, o.AttemptID
		states[i], codes[i], results[i], outcomes[i] = string(to), string(o.Code), string(o.Attempt), o.Attempt.Legacy()
		errs[i], reasons[i], provIDs[i], next[i] = o.Error, o.Reason, o.ProviderID, o.NextAttemptAt
	}
	return pgx.NamedArgs{
		"now": now, "ids": ids, "fences": fences, "attempt_ids": attemptIDs, "states": states, "codes": codes,
		"results": results, "outcomes": outcomes, "next_attempts": next, "errors": errs, "reasons": reasons,
		"provider_ids": provIDs, "actor": actor,
	}, nil
}
