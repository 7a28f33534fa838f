package store

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// The promoter of the due-ordered store (schema 38; docs/benchmarks.md, "A
// due-ordered store for the spread claim"). With lazy intake on, a reminder
// due far enough ahead gets no reminder_state row at intake (reminders.lazy);
// the promoter inserts the state rows of the lazy reminders due before
// now + H in (due_at, id) order, so the rows of one minute share heap pages
// and the claim reads few. Promoted rows are ordinary pending rows: ClaimDue
// claims them unchanged.
//
// The race it must win: a web transaction that wrote a lazy reminder and
// commits after a pass's snapshot passed its due time. A sweep covers a
// range up to until in bounded passes, from a read of the transactions that
// hold a write lock on reminders (PromoterRead) taken before any of its
// snapshots; the final watermark moves to a completed sweep's end only once
// those writers are gone before the next sweep starts, and that sweep has
// scanned the range again. A transaction that first locked reminders after
// the read writes only reminders due at least the intake horizon after its
// clock, past any until of that sweep. So no committed reminder is ever left
// below final without its state row, and a long transaction never blocks
// intake.
//
// Where a sweep starts (schema 46; docs/benchmarks.md, "The promoter's
// re-scan, bounded by a floor per waited writer"): below the last complete
// sweep's end only the writers it waited for can have left a reminder
// without its state row, and each of those writes only at or past its
// floor, the provisional end read before it was first seen (it took its
// lock after that read). So a sweep starts at the smallest floor among the
// waited writers that are gone, at the last sweep's end when none is (a
// long transaction then costs nothing until it ends, and one re-scan from
// its floor after), and at final when the floors are not known (a sweep of
// the previous release, which keeps none, or a watermark moved by hand).

// Promotion is what one promoter pass did, and the watermarks after it.
type Promotion struct {
	// Read is how many lazy reminders the pass read, Promoted how many state
	// rows it inserted (the others had theirs).
	Read     int
	Promoted int64
	// Final is the final watermark: below it every committed lazy reminder
	// has its state row.
	Final time.Time
	// Through is the provisional end: every lazy reminder visible to the
	// pass and due before it has its state row. Zero: no lazy reminder lies
	// beyond what the promoter covered, so nothing bounds the claim.
	Through time.Time
	// SweepDone: the pass completed its sweep (the next pass starts one).
	SweepDone bool
	// From is where the pass began reading: its sweep's start (final, the
	// last sweep's end, or a gone writer's floor) when it started one,
	// else the sweep's cursor.
	From time.Time
}

// ClaimCutoff is the claim's cutoff (ClaimDue takes rows due at or before
// it) after this pass: cutoff, but before Through when that is earlier, so
// a run never claims a minute whose lazy reminders are not promoted yet.
func (p Promotion) ClaimCutoff(cutoff time.Time) time.Time {
	if p.Through.IsZero() || cutoff.Before(p.Through) {
		return cutoff
	}
	return p.Through.Add(-time.Microsecond) // PostgreSQL's resolution
}

// watermark is nudge_promoter's row.
type watermark struct {
	Final     time.Time
	ProvUntil *time.Time
	// ProvWait: the last complete sweep's writers, which the next sweep
	// waits for. A pass sets it only when it completes a sweep (saved as
	// is; nil keeps the stored ones).
	ProvWait []string
	// FloorWait and FloorAt (parallel): the writers read when the last
	// sweep this release started began, and their floors (schema 46). Nil
	// FloorWait: not known (no such sweep yet, or reset by hand).
	FloorWait []string
	FloorAt   []time.Time
	Sweep     *sweep // nil: no sweep in progress
}

// reading is what PromoterRead read beside the row, once per sweep: the
// farthest a sweep begun now may reach (the database's clock plus the
// horizon), the transactions that hold a write lock on reminders, and
// which of the row's ProvWait still hold their virtualxid lock, from one
// read of pg_locks.
type reading struct {
	Limit   time.Time
	Writers []string
	Alive   []string
}

// sweep is a sweep in progress: its end, the writers on reminders at its
// first pass, whether the last complete sweep's writers were gone then, and
// the keyset cursor (the last key read).
type sweep struct {
	Until    time.Time
	Wait     []string
	PrevDone bool
	AfterDue time.Time
	AfterID  int64
}

// startSweep returns w with a sweep in progress: w's own, or a new one to
// until, but no farther than r.Limit and never short of the last complete
// sweep's end (a clock that went back must not leave part of it unscanned
// by the sweep that moves final over it). The new sweep waits for
// r.Writers, records each one's floor, and starts where sweepFrom says;
// final moves at its end if none of ProvWait is still in flight.
func startSweep(w watermark, until time.Time, r reading) watermark {
	if w.Sweep != nil {
		return w
	}
	end := until
	if r.Limit.Before(end) {
		end = r.Limit
	}
	floor := w.Final
	if w.ProvUntil != nil && w.ProvUntil.After(floor) {
		floor = *w.ProvUntil
	}
	if end.Before(floor) {
		end = floor
	}
	writers := r.Writers
	if writers == nil {
		writers = []string{}
	}
	prevDone := true
	for _, v := range w.ProvWait {
		if slices.Contains(r.Alive, v) {
			prevDone = false
		}
	}
	known := floorsKnown(w)
	at := make([]time.Time, len(writers))
	for i, v := range writers {
		at[i] = newFloor(w, known, v)
	}
	w.Sweep = &sweep{Until: end, Wait: writers, PrevDone: prevDone, AfterDue: sweepFrom(w, known, r)}
	w.FloorWait, w.FloorAt = writers, at
	return w
}

// floorsKnown returns the floors of w.ProvWait's writers when w holds them
// (FloorWait is the same set: the last complete sweep was started by this
// release), else nil.
func floorsKnown(w watermark) map[string]time.Time {
	if w.FloorWait == nil || len(w.FloorWait) != len(w.FloorAt) {
		return nil
	}
	known := make(map[string]time.Time, len(w.FloorWait))
	for i, v := range w.FloorWait {
		known[v] = w.FloorAt[i]
	}
	for _, v := range w.ProvWait {
		if _, ok := known[v]; !ok {
			return nil
		}
	}
	for _, v := range w.FloorWait {
		if !slices.Contains(w.ProvWait, v) {
			return nil
		}
	}
	return known
}

// newFloor is the floor of writer v read at a sweep's start: its own if
// the last sweep waited for it too (final when not known: every writer the
// last sweep waited for writes at or past final, as final moved past the
// end of a sweep only once that sweep's writers were gone), else the last
// complete sweep's end (v took its lock after that sweep's read), or final
// when no sweep completed yet.
func newFloor(w watermark, known map[string]time.Time, v string) time.Time {
	if slices.Contains(w.ProvWait, v) {
		if f, ok := known[v]; ok {
			return f
		}
		return w.Final
	}
	if w.ProvUntil == nil {
		return w.Final
	}
	return *w.ProvUntil
}

// sweepFrom is where a new sweep starts: the last complete sweep's end,
// or the smallest floor among its writers that are gone (no longer holding
// their lock on reminders, or no longer in flight), never below final; at
// final when the floors are not known or no sweep completed yet (as every
// sweep started before schema 46).
func sweepFrom(w watermark, known map[string]time.Time, r reading) time.Time {
	if known == nil || w.ProvUntil == nil {
		return w.Final
	}
	from := *w.ProvUntil
	for _, v := range w.ProvWait {
		if slices.Contains(r.Writers, v) && slices.Contains(r.Alive, v) {
			continue // still in flight: waited for again
		}
		if f := known[v]; f.Before(from) {
			from = f
		}
	}
	if from.Before(w.Final) {
		from = w.Final
	}
	return from
}

// afterPass returns w after a pass of its sweep read read reminders of at
// most limit, the last at (lastDue, lastID): a short read completes the
// sweep (final moves to the last complete sweep's end if that sweep's
// writers were gone when this one started; this sweep becomes the last
// complete one); a full one moves the cursor.
func afterPass(w watermark, read, limit int, lastDue time.Time, lastID int64) watermark {
	s := *w.Sweep
	if read < limit {
		if s.PrevDone && w.ProvUntil != nil && w.ProvUntil.After(w.Final) {
			w.Final = *w.ProvUntil
		}
		end := s.Until
		w.ProvUntil, w.ProvWait, w.Sweep = &end, s.Wait, nil
		if w.ProvWait == nil {
			w.ProvWait = []string{} // saved as none, where nil keeps the last ones
		}
		return w
	}
	s.AfterDue, s.AfterID = lastDue, lastID
	w.Sweep = &s
	return w
}

// through is the provisional end after a pass (Promotion.Through): the
// last complete sweep's end, or the cursor of the sweep in progress when it
// is farther; zero when the sweep is complete and no lazy reminder is due
// at or after its end (lazyBeyond false).
func through(w watermark, lazyBeyond bool) time.Time {
	var t time.Time
	if w.ProvUntil != nil {
		t = *w.ProvUntil
	}
	if w.Sweep == nil {
		if !lazyBeyond {
			return time.Time{}
		}
		return t
	}
	if w.Sweep.AfterDue.After(t) {
		t = w.Sweep.AfterDue
	}
	return t
}

// Promote runs one promoter pass in one transaction: it locks the
// watermark (PromoterLock), reads it and the writers in flight (PromoterRead), starts a sweep to
// until (the caller's clock plus H) if none is in progress, bounded by the
// database's clock plus the smaller of ahead (H) and lazy intake's horizon,
// inserts the state rows of up to limit lazy reminders of the sweep in
// (due_at, id) order (Promote), and saves the watermark (PromoterSave). With
// nothing lazy it is a lock of one row, a read of pg_locks, an empty index
// scan and the row's update.
func (s *Store) Promote(ctx context.Context, until time.Time, ahead time.Duration, limit int) (Promotion, error) {
	var p Promotion
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var w watermark
		var sw storedSweep
		var r reading
		var hasFloors bool // schema 46 applied
		if _, err := tx.Exec(ctx, query("PromoterLock")); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, query("PromoterRead"), pgx.NamedArgs{"ahead": ahead}).Scan(&w.Final, &w.ProvUntil,
			&w.ProvWait, &hasFloors, &w.FloorWait, &w.FloorAt, &sw.until, &sw.wait, &sw.prevDone, &sw.afterDue, &sw.afterID,
			&r.Limit, &r.Writers, &r.Alive); err != nil {
			return err
		}
		w.Sweep = sw.sweep()
		started := w.Sweep == nil
		w = startSweep(w, until, r)
		var err error
		if p, w, err = promotePass(ctx, tx, w, limit); err != nil {
			return err
		}
		if !started {
			w.FloorWait, w.FloorAt = nil, nil // kept as stored
		}
		save := query("PromoterSave")
		if !hasFloors {
			save = query("PromoterSaveSchema45")
		}
		_, err = tx.Exec(ctx, save, saveArgs(w, ahead))
		return err
	})
	if err != nil {
		return Promotion{}, fmt.Errorf("promoting lazy reminders: %w", err)
	}
	return p, nil
}

// storedSweep is the sweep in progress as PromoterRead returns it (all
// NULL: none).
type storedSweep struct {
	until    *time.Time
	wait     []string
	prevDone *bool
	afterDue *time.Time
	afterID  *int64
}

func (sw storedSweep) sweep() *sweep {
	if sw.until == nil {
		return nil
	}
	return &sweep{Until: *sw.until, Wait: sw.wait, PrevDone: *sw.prevDone, AfterDue: *sw.afterDue, AfterID: *sw.afterID}
}

// promotePass runs the Promote statement of w's sweep (up to limit
// reminders from its cursor) and returns what it did and w after it.
func promotePass(ctx context.Context, tx pgx.Tx, w watermark, limit int) (Promotion, watermark, error) {
	p := Promotion{From: w.Sweep.AfterDue}
	var lastDue *time.Time
	var lastID *int64
	var lazyBeyond bool
	if err := tx.QueryRow(ctx, query("Promote"), pgx.NamedArgs{"after_due": w.Sweep.AfterDue,
		"after_id": w.Sweep.AfterID, "until": w.Sweep.Until, "limit": limit}).
		Scan(&p.Read, &p.Promoted, &lastDue, &lastID, &lazyBeyond); err != nil {
		return p, w, err
	}
	if lastDue == nil {
		lastDue, lastID = &w.Sweep.AfterDue, &w.Sweep.AfterID
	}
	w = afterPass(w, p.Read, limit, *lastDue, *lastID)
	p.Final, p.Through, p.SweepDone = w.Final, through(w, lazyBeyond), w.Sweep == nil
	return p, w, nil
}

// saveArgs are PromoterSave's arguments for w after a pass with horizon
// ahead (PromoterSaveSchema45 takes the same but the floors).
func saveArgs(w watermark, ahead time.Duration) pgx.NamedArgs {
	args := pgx.NamedArgs{"ahead": ahead, "final_until": w.Final, "prov_until": w.ProvUntil, "prov_wait": w.ProvWait,
		"floor_wait": w.FloorWait, "floor_at": w.FloorAt, "sweep_until": nil, "sweep_wait": nil, "sweep_prev_done": nil,
		"cursor_due": nil, "cursor_id": nil}
	if w.Sweep != nil {
		args["sweep_until"], args["sweep_wait"], args["sweep_prev_done"] = w.Sweep.Until, w.Sweep.Wait, w.Sweep.PrevDone
		args["cursor_due"], args["cursor_id"] = w.Sweep.AfterDue, w.Sweep.AfterID
	}
	return args
}
