package store

import (
	"context"
	"fmt"
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
// commits after a pass's snapshot passed its due time. A sweep covers
// [final, until) in bounded passes, from a read of the transactions that
// hold a write lock on reminders (PromoterRead) taken before any of its
// snapshots; the final watermark moves to a completed sweep's end only once
// those writers are gone before the next sweep starts, and that sweep has
// scanned the range again. A transaction that first locked reminders after
// the read writes only reminders due at least the intake horizon after its
// clock, past any until of that sweep. So no committed reminder is ever left
// below final without its state row, and a long transaction costs re-scans,
// never a blocked intake.

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
	// ProvWait is set only when a pass completes a sweep: that sweep's
	// writers, for the next sweep to wait for.
	ProvWait []string
	Sweep    *sweep // nil: no sweep in progress
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

// startSweep returns w with a sweep in progress: w's own, or a new one from
// the final watermark to until, but no farther than limit (the database's
// clock plus the horizon, read with writers) and never short of the last
// complete sweep's end (a clock that went back must not leave part of it
// unscanned by the sweep that moves final over it).
func startSweep(w watermark, until, limit time.Time, writers []string, prevDone bool) watermark {
	if w.Sweep != nil {
		return w
	}
	end := until
	if limit.Before(end) {
		end = limit
	}
	floor := w.Final
	if w.ProvUntil != nil && w.ProvUntil.After(floor) {
		floor = *w.ProvUntil
	}
	if end.Before(floor) {
		end = floor
	}
	if writers == nil {
		writers = []string{}
	}
	w.Sweep = &sweep{Until: end, Wait: writers, PrevDone: prevDone, AfterDue: w.Final}
	return w
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
		var sw struct {
			until    *time.Time
			wait     []string
			prevDone *bool
			afterDue *time.Time
			afterID  *int64
		}
		var limitAt time.Time
		var writers []string
		var done bool
		if _, err := tx.Exec(ctx, query("PromoterLock")); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, query("PromoterRead"), pgx.NamedArgs{"ahead": ahead}).Scan(&w.Final, &w.ProvUntil,
			&sw.until, &sw.wait, &sw.prevDone, &sw.afterDue, &sw.afterID, &limitAt, &writers, &done); err != nil {
			return err
		}
		if sw.until != nil {
			w.Sweep = &sweep{Until: *sw.until, Wait: sw.wait, PrevDone: *sw.prevDone, AfterDue: *sw.afterDue,
				AfterID: *sw.afterID}
		}
		w = startSweep(w, until, limitAt, writers, done)
		var lastDue *time.Time
		var lastID *int64
		var lazyBeyond bool
		if err := tx.QueryRow(ctx, query("Promote"), pgx.NamedArgs{"after_due": w.Sweep.AfterDue,
			"after_id": w.Sweep.AfterID, "until": w.Sweep.Until, "limit": limit}).
			Scan(&p.Read, &p.Promoted, &lastDue, &lastID, &lazyBeyond); err != nil {
			return err
		}
		if lastDue == nil {
			lastDue, lastID = &w.Sweep.AfterDue, &w.Sweep.AfterID
		}
		w = afterPass(w, p.Read, limit, *lastDue, *lastID)
		p.Final, p.Through, p.SweepDone = w.Final, through(w, lazyBeyond), w.Sweep == nil
		args := pgx.NamedArgs{"ahead": ahead, "final_until": w.Final, "prov_until": w.ProvUntil, "prov_wait": w.ProvWait,
			"sweep_until": nil, "sweep_wait": nil, "sweep_prev_done": nil, "cursor_due": nil, "cursor_id": nil}
		if w.Sweep != nil {
			args["sweep_until"], args["sweep_wait"], args["sweep_prev_done"] = w.Sweep.Until, w.Sweep.Wait, w.Sweep.PrevDone
			args["cursor_due"], args["cursor_id"] = w.Sweep.AfterDue, w.Sweep.AfterID
		}
		_, err := tx.Exec(ctx, query("PromoterSave"), args)
		return err
	})
	if err != nil {
		return Promotion{}, fmt.Errorf("promoting lazy reminders: %w", err)
	}
	return p, nil
}
