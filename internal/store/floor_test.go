package store

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
)

// The promoter's floors per waited writer (schema 46), on the real
// statements: what a sweep re-reads while writers stay open, come and go,
// and when the previous release's passes run in between. After every pass
// no committed reminder lies below the final watermark without its state
// row (passerTo and previousPass assert it).
//
// Every reminder is scheduled lazy under a 2-hour horizon and the horizon
// is then widened to 4 hours, so passes reach them now (TestPromoterRace);
// each writer's reminders are due at or past the end of the last sweep
// before it began, as lazy intake makes them in production (the floor's
// premise).

// previousPass is a pass of the previous release (internal/upgrade's
// OldRelease) on this schema: its statements (testdata/promoter45.sql's
// read, PromoterSaveSchema45), a
// sweep it starts scans from final, and it leaves schema 46's columns as
// they were. H 3h, passes of 100, as passerTo.
func previousPass(t *testing.T, db *testenv.DB, until time.Time) Promotion {
	t.Helper()
	ctx := context.Background()
	var p Promotion
	require.NoError(t, pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		var w watermark
		var sw storedSweep
		var r reading
		var done bool
		if _, err := tx.Exec(ctx, query("PromoterLock")); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, promoter45SQL("PromoterReadSchema45"), pgx.NamedArgs{"ahead": 3 * time.Hour}).Scan(
			&w.Final, &w.ProvUntil, &sw.until, &sw.wait, &sw.prevDone, &sw.afterDue, &sw.afterID,
			&r.Limit, &r.Writers, &done); err != nil {
			return err
		}
		if w.Sweep = sw.sweep(); w.Sweep == nil {
			w = startSweep(w, until, r) // no floors: from final, as the previous release's
			w.Sweep.PrevDone = done
			require.True(t, w.Sweep.AfterDue.Equal(w.Final), "the previous release starts at final")
		}
		var err error
		if p, w, err = promotePass(ctx, tx, w, 100); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, query("PromoterSaveSchema45"), saveArgs(w, 3*time.Hour))
		return err
	}))
	require.True(t, p.SweepDone)
	require.Zero(t, lostBelowWatermark(t, db), "reminders below the final watermark %s without a state row", p.Final)
	return p
}

// promoter45SQL is testdata/promoter45.sql's statement called name.
var promoter45SQL = testdataSQL("testdata/promoter45.sql")

// floorFixture is a schema with lazy intake on (2 hours) and t0, the
// time the reminders' due times count from.
type floorFixture struct {
	t  *testing.T
	db *testenv.DB
	t0 time.Time
}

func newFloorFixture(t *testing.T) *floorFixture {
	db := testenv.Postgres(t)
	setLazyIntake(t, db, durationPtr(2*time.Hour))
	return &floorFixture{t: t, db: db, t0: time.Now().UTC().Truncate(time.Second)}
}

// at is t0 plus 2h and m minutes (lazy when scheduled now).
func (f *floorFixture) at(m int) time.Time {
	return f.t0.Add(2*time.Hour + time.Duration(m)*time.Minute)
}

// schedule schedules key due at m (f.at) through q, lazy (the horizon set
// to 2 hours for it, then 4 again, so passes reach it).
func (f *floorFixture) schedule(q intake.Querier, key string, m int) {
	f.t.Helper()
	setLazyIntake(f.t, f.db, durationPtr(2*time.Hour))
	scheduleSMS(f.t, q, key, f.at(m))
	lazy, _ := lazyAndState(f.t, q, key)
	require.True(f.t, lazy, key)
	setLazyIntake(f.t, f.db, durationPtr(4*time.Hour))
}

// open begins a web transaction that schedules key due at m and stays open.
func (f *floorFixture) open(key string, m int) pgx.Tx {
	f.t.Helper()
	web, err := f.db.Pool.Begin(context.Background())
	require.NoError(f.t, err)
	f.t.Cleanup(func() { web.Rollback(context.Background()) }) //nolint:errcheck
	f.schedule(web, key, m)
	return web
}

func (f *floorFixture) promoted(key string) bool {
	f.t.Helper()
	_, s := lazyAndState(f.t, f.db.Pool, key)
	return s
}

// A long web transaction open over several sweeps costs no re-read after
// the first; two writers with different floors: the one that ends first is
// re-scanned from its own floor (not the other's, nor final), and the other
// from its floor once it ends; final stays until both are gone.
func TestPromoterFloorsOfTwoWriters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFloorFixture(t)
	step := passerTo(t, f.db)
	a := f.open("web-a", 10) // before the first sweep: floor final
	for i, m := range []int{15, 16, 17} {
		f.schedule(f.db.Pool, "low-"+string(rune('0'+i)), m)
	}
	for i, m := range []int{45, 50} {
		f.schedule(f.db.Pool, "high-"+string(rune('0'+i)), m)
	}

	p := step(f.at(30))
	f0 := p.Final
	require.Equal(t, 3, p.Read, "the first sweep after the migration: from final, the committed ones")
	require.EqualValues(t, 3, p.Promoted)
	b := f.open("web-b", 40) // after it: floor at(30)
	p = step(f.at(60))
	require.Equal(t, 2, p.Read, "nobody gone: only the new interval [at(30), at(60))")
	require.EqualValues(t, 2, p.Promoted)
	for range 3 {
		p = step(f.at(60))
		require.Zero(t, p.Read, "both in flight: nothing re-read")
		require.True(t, p.Final.Equal(f0), "final stays (%s)", p.Final)
	}

	require.NoError(t, b.Commit(ctx))
	p = step(f.at(60))
	require.Equal(t, 3, p.Read, "web-b gone: from its floor at(30): its reminder and the two high ones")
	require.EqualValues(t, 1, p.Promoted)
	require.True(t, p.From.Equal(f.at(30)), "from %s", p.From)
	require.True(t, f.promoted("web-b"))
	_, promoted := lazyAndState(t, a, "web-a")
	require.False(t, promoted, "web-a in flight: not promoted")
	require.True(t, p.Final.Equal(f0), "web-a in flight: final stays (%s)", p.Final)
	p = step(f.at(60))
	require.Zero(t, p.Read, "web-a in flight: nothing re-read")

	require.NoError(t, a.Commit(ctx))
	p = step(f.at(60))
	require.Equal(t, 7, p.Read, "web-a gone: from its floor (final), everything")
	require.EqualValues(t, 1, p.Promoted)
	require.True(t, f.promoted("web-a"))
	require.True(t, p.Final.After(f0), "both gone: final moves (%s)", p.Final)
	p = step(f.at(60))
	require.Zero(t, p.Read)
	require.True(t, p.Final.Equal(f.at(60)), "final %s", p.Final)
}

// Short writers: one seen by a sweep's read and gone at the next costs a
// re-scan from its floor (the interval of the sweep before), one that
// begins and ends between two reads none (its reminders are past the
// last sweep's end, read as new).
func TestPromoterWriterGoneBetweenReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFloorFixture(t)
	step := passerTo(t, f.db)
	f.schedule(f.db.Pool, "c-0", 5)
	step(f.at(20))
	step(f.at(20)) // floors known from here
	f.schedule(f.db.Pool, "c-1", 25)
	c := f.open("web-c", 28) // seen by the next read: floor at(20)
	p := step(f.at(30))
	require.Equal(t, 1, p.Read, "the new interval: c-1")
	require.NoError(t, c.Commit(ctx))
	p = step(f.at(40))
	require.True(t, p.From.Equal(f.at(20)), "web-c gone: from its floor, %s", p.From)
	require.Equal(t, 2, p.Read, "c-1 again and web-c")
	require.EqualValues(t, 1, p.Promoted)

	f.schedule(f.db.Pool, "d-0", 45) // a writer between two reads, never seen
	p = step(f.at(50))
	require.True(t, p.From.Equal(f.at(40)), "nobody waited for: from the last end, %s", p.From)
	require.Equal(t, 1, p.Read)
	require.EqualValues(t, 1, p.Promoted)
	require.True(t, f.promoted("d-0"))
	p = step(f.at(50))
	require.Zero(t, p.Read)
	require.True(t, p.Final.Equal(f.at(50)), "final %s", p.Final)

	// Floors forgotten (NULL: as schema 46 leaves a running install, or
	// testenv's Unpromote): the next sweep starts at final.
	f.schedule(f.db.Pool, "c-2", 55)
	f.open("web-z", 58)
	require.Equal(t, 1, step(f.at(60)).Read, "c-2")
	p = step(f.at(60))
	require.Zero(t, p.Read, "web-z in flight: nothing re-read")
	require.True(t, p.Final.Equal(f.at(50)), "final %s", p.Final)
	_, err := f.db.Pool.Exec(ctx, `UPDATE nudge_promoter SET floor_wait = NULL, floor_at = NULL`)
	require.NoError(t, err)
	p = step(f.at(60))
	require.True(t, p.From.Equal(f.at(50)), "from final, %s", p.From)
	require.Equal(t, 1, p.Read, "c-2 again")
}

// The previous release's passes between this release's (a rolling
// upgrade): a sweep it started leaves prov_wait without this release's
// floors for it, and the next sweep of this release starts at final, as
// before schema 46; once this release's own sweep has recorded the floors,
// a long writer costs nothing again. No loss at any step.
func TestPromoterFloorsWithThePreviousReleaseBetween(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFloorFixture(t)
	step := passerTo(t, f.db)
	a := f.open("web-a", 10)
	f.schedule(f.db.Pool, "c-0", 15)
	step(f.at(20))
	p := step(f.at(20))
	require.Zero(t, p.Read, "this release, web-a in flight: nothing re-read")

	e := f.open("web-e", 25) // a writer only the previous release's read sees
	p = previousPass(t, f.db, f.at(30))
	require.Equal(t, 1, p.Read, "the previous release: from final (c-0)")
	p = previousPass(t, f.db, f.at(30))
	require.Equal(t, 1, p.Read, "the previous release: from final again")
	require.NoError(t, e.Commit(ctx))

	p = step(f.at(30))
	require.Equal(t, 2, p.Read, "its writers without floors: from final, c-0 and web-e")
	require.EqualValues(t, 1, p.Promoted)
	require.True(t, f.promoted("web-e"))
	p = step(f.at(30))
	require.Zero(t, p.Read, "floors recorded by this release's sweep: web-a in flight costs nothing")

	// The previous release continues and completes a sweep this release
	// started (passes of one reminder: the sweep spans passes).
	f.schedule(f.db.Pool, "c-1", 32)
	f.schedule(f.db.Pool, "c-2", 33)
	st := New(f.db.Pool)
	q, err := st.Promote(ctx, f.at(40), 3*time.Hour, 1)
	require.NoError(t, err)
	require.False(t, q.SweepDone)
	require.True(t, q.From.Equal(f.at(30)), "from %s", q.From)
	for range 3 {
		if q = previousPass(t, f.db, f.at(40)); q.SweepDone {
			break
		}
	}
	require.NoError(t, a.Commit(ctx))
	p = step(f.at(40))
	require.True(t, f.promoted("web-a"))
	require.True(t, p.From.Equal(p.Final) || p.From.Before(f.at(10)), "web-a gone: from its floor, final (%s)", p.From)
	p = step(f.at(40))
	require.Zero(t, p.Read)
	require.True(t, p.Final.Equal(f.at(40)), "final %s", p.Final)
}

// On a schema without 46's columns (an install at 43 during a rollout from
// a release before 44: 46 waits behind 44) this release's passes work as
// before it: every sweep starts at final, and no loss.
func TestPromoterWithoutSchema46(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFloorFixture(t)
	_, err := f.db.Pool.Exec(ctx, `ALTER TABLE nudge_promoter DROP COLUMN floor_wait, DROP COLUMN floor_at`)
	require.NoError(t, err)
	step := passerTo(t, f.db)
	a := f.open("web-a", 10)
	f.schedule(f.db.Pool, "c-0", 15)
	f0 := step(f.at(20)).Final
	for range 2 {
		p := step(f.at(20))
		require.Equal(t, 1, p.Read, "no floors: from final, c-0 again")
		require.True(t, p.From.Equal(f0), "from %s", p.From)
	}
	require.NoError(t, a.Commit(ctx))
	p := step(f.at(20))
	require.EqualValues(t, 1, p.Promoted)
	require.True(t, f.promoted("web-a"))
	require.True(t, step(f.at(20)).Final.Equal(f.at(20)))
}
