package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// The promoter's decisions: where a sweep starts and ends, when the final
// watermark moves, and what bounds the claim.
func TestPromoterSweepDecisions(t *testing.T) {
	t.Parallel()
	at := func(m int) time.Time { return time.Date(2026, 12, 2, 9, m, 0, 0, time.UTC) }
	ptr := func(t time.Time) *time.Time { return &t }
	cases := []struct {
		name                 string
		w                    watermark
		until, limit         time.Time
		prevDone             bool
		read, max            int
		wantFinal, wantProv  time.Time
		wantSweep            bool
		wantThrough          time.Time // lazyBeyond true
		wantCursor           time.Time
		wantUnboundedIfEmpty bool
	}{
		{name: "first sweep completes: final stays, its end becomes provisional",
			w: watermark{Final: at(0)}, until: at(60), limit: at(90), prevDone: true, read: 3, max: 10,
			wantFinal: at(0), wantProv: at(60), wantThrough: at(60), wantUnboundedIfEmpty: true},
		{name: "the database's clock bounds the sweep",
			w: watermark{Final: at(0)}, until: at(60), limit: at(30), prevDone: true, read: 0, max: 10,
			wantFinal: at(0), wantProv: at(30), wantThrough: at(30), wantUnboundedIfEmpty: true},
		{name: "last sweep's writers gone: final moves to its end",
			w: watermark{Final: at(0), ProvUntil: ptr(at(60))}, until: at(61), limit: at(90), prevDone: true,
			read: 2, max: 10, wantFinal: at(60), wantProv: at(61), wantThrough: at(61), wantUnboundedIfEmpty: true},
		{name: "a writer of the last sweep in flight: final stays",
			w: watermark{Final: at(0), ProvUntil: ptr(at(60))}, until: at(61), limit: at(90), prevDone: false,
			read: 2, max: 10, wantFinal: at(0), wantProv: at(61), wantThrough: at(61), wantUnboundedIfEmpty: true},
		{name: "a clock that went back still rescans the last sweep's range",
			w: watermark{Final: at(0), ProvUntil: ptr(at(60))}, until: at(10), limit: at(90), prevDone: true,
			read: 0, max: 10, wantFinal: at(60), wantProv: at(60), wantThrough: at(60), wantUnboundedIfEmpty: true},
		{name: "a full pass moves the cursor, not final",
			w: watermark{Final: at(0), ProvUntil: ptr(at(5))}, until: at(60), limit: at(90), prevDone: true,
			read: 10, max: 10, wantFinal: at(0), wantProv: at(5), wantSweep: true, wantCursor: at(20),
			wantThrough: at(20)},
		{name: "a cursor short of the last sweep's end: that end bounds the claim",
			w: watermark{Final: at(0), ProvUntil: ptr(at(30))}, until: at(60), limit: at(90), prevDone: true,
			read: 10, max: 10, wantFinal: at(0), wantProv: at(30), wantSweep: true, wantCursor: at(20),
			wantThrough: at(30)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := reading{Limit: c.limit}
			if !c.prevDone {
				c.w.ProvWait = []string{"1/5"} // in flight
				r.Alive = c.w.ProvWait
			}
			w := startSweep(c.w, c.until, r)
			require.NotNil(t, w.Sweep)
			require.Equal(t, c.w.Final, w.Sweep.AfterDue, "a sweep starts at the final watermark")
			w = afterPass(w, c.read, c.max, at(20), 7)
			require.True(t, c.wantFinal.Equal(w.Final), "final %s", w.Final)
			require.True(t, c.wantProv.Equal(*w.ProvUntil), "provisional %s", *w.ProvUntil)
			require.Equal(t, c.wantSweep, w.Sweep != nil, "sweep in progress")
			if c.wantSweep {
				require.True(t, c.wantCursor.Equal(w.Sweep.AfterDue))
				require.EqualValues(t, 7, w.Sweep.AfterID)
				require.Nil(t, w.ProvWait, "a sweep in progress keeps the last one's writers")
				// A sweep in progress is resumed, not restarted.
				require.Equal(t, w, startSweep(w, c.until.Add(time.Hour),
					reading{Limit: c.limit.Add(time.Hour), Writers: []string{"3/9"}, Alive: []string{"1/5"}}))
			} else {
				require.Equal(t, []string{}, w.ProvWait, "the completed sweep's writers (none) are kept")
			}
			require.True(t, c.wantThrough.Equal(through(w, true)), "through %s", through(w, true))
			require.Equal(t, c.wantUnboundedIfEmpty, through(w, false).IsZero())
		})
	}
	p := Promotion{Through: at(30)}
	require.True(t, p.ClaimCutoff(at(10)).Equal(at(10)))
	require.True(t, p.ClaimCutoff(at(40)).Equal(at(30).Add(-time.Microsecond)))
	require.True(t, Promotion{}.ClaimCutoff(at(40)).Equal(at(40)))
}

// Where a sweep starts (schema 46): at the last sweep's end unless a
// writer it waited for is gone, then at the smallest such writer's floor
// (never below final); at final whenever the floors are not this
// release's; and the floors a new sweep records for its writers.
func TestPromoterSweepStart(t *testing.T) {
	t.Parallel()
	at := func(m int) time.Time { return time.Date(2026, 12, 2, 9, m, 0, 0, time.UTC) }
	ptr := func(t time.Time) *time.Time { return &t }
	mark := func(final, prov int, wait []string, floors map[string]int) watermark {
		w := watermark{Final: at(final), ProvUntil: ptr(at(prov)), ProvWait: wait}
		if floors != nil {
			w.FloorWait, w.FloorAt = []string{}, []time.Time{}
			for _, v := range wait { // FloorWait in prov_wait's order, as a sweep of this release stores it
				if f, ok := floors[v]; ok {
					w.FloorWait, w.FloorAt = append(w.FloorWait, v), append(w.FloorAt, at(f))
				}
			}
			for v, f := range floors {
				if !slices.Contains(wait, v) {
					w.FloorWait, w.FloorAt = append(w.FloorWait, v), append(w.FloorAt, at(f))
				}
			}
		}
		return w
	}
	cases := []struct {
		name       string
		w          watermark
		r          reading
		wantFrom   time.Time
		wantFloors map[string]time.Time // the new sweep's writers
		wantDone   bool                 // PrevDone
	}{
		{name: "nobody waited for: the last sweep's end",
			w: mark(10, 60, []string{}, map[string]int{}), r: reading{},
			wantFrom: at(60), wantFloors: map[string]time.Time{}, wantDone: true},
		{name: "a long writer in flight: no re-scan, its floor kept",
			w:        mark(10, 60, []string{"3/7"}, map[string]int{"3/7": 10}),
			r:        reading{Writers: []string{"3/7"}, Alive: []string{"3/7"}},
			wantFrom: at(60), wantFloors: map[string]time.Time{"3/7": at(10)}},
		{name: "it is gone: from its floor",
			w: mark(10, 60, []string{"3/7"}, map[string]int{"3/7": 10}), r: reading{},
			wantFrom: at(10), wantFloors: map[string]time.Time{}, wantDone: true},
		{name: "a short writer gone, a new one: from the gone one's floor; the new one's is the last end",
			w: mark(30, 60, []string{"4/1"}, map[string]int{"4/1": 45}), r: reading{Writers: []string{"4/2"}},
			wantFrom: at(45), wantFloors: map[string]time.Time{"4/2": at(60)}, wantDone: true},
		{name: "two writers, the later floor's gone: from its floor, the other waited for",
			w:        mark(10, 60, []string{"3/7", "5/2"}, map[string]int{"3/7": 10, "5/2": 40}),
			r:        reading{Writers: []string{"3/7"}, Alive: []string{"3/7"}},
			wantFrom: at(40), wantFloors: map[string]time.Time{"3/7": at(10)}},
		{name: "two writers, the earlier floor's gone: from its floor",
			w:        mark(10, 60, []string{"3/7", "5/2"}, map[string]int{"3/7": 10, "5/2": 40}),
			r:        reading{Writers: []string{"5/2"}, Alive: []string{"5/2"}},
			wantFrom: at(10), wantFloors: map[string]time.Time{"5/2": at(40)}},
		{name: "both gone: from the smaller floor",
			w: mark(10, 60, []string{"3/7", "5/2"}, map[string]int{"3/7": 10, "5/2": 40}), r: reading{},
			wantFrom: at(10), wantFloors: map[string]time.Time{}, wantDone: true},
		{name: "a floor below final: from final",
			w: mark(20, 60, []string{"3/7"}, map[string]int{"3/7": 10}), r: reading{},
			wantFrom: at(20), wantFloors: map[string]time.Time{}, wantDone: true},
		{name: "in flight but no longer holding its lock: gone (nothing of it can commit), re-scanned",
			w: mark(10, 60, []string{"3/7"}, map[string]int{"3/7": 30}), r: reading{Alive: []string{"3/7"}},
			wantFrom: at(30), wantFloors: map[string]time.Time{}},
		{name: "holding its lock but not in flight in the same read: gone",
			w: mark(10, 60, []string{"3/7"}, map[string]int{"3/7": 30}), r: reading{Writers: []string{"3/7"}},
			wantFrom: at(30), wantFloors: map[string]time.Time{"3/7": at(30)}, wantDone: true},
		{name: "floors unknown (schema 46's first sweep): from final; a waited writer's floor is final",
			w: mark(10, 60, []string{"3/7"}, nil), r: reading{Writers: []string{"3/7", "8/1"}, Alive: []string{"3/7"}},
			wantFrom: at(10), wantFloors: map[string]time.Time{"3/7": at(10), "8/1": at(60)}},
		{name: "the previous release's sweep (its writers not the floors' set): from final",
			w:        mark(10, 60, []string{"3/7", "6/6"}, map[string]int{"3/7": 30}),
			r:        reading{Writers: []string{"3/7"}, Alive: []string{"3/7"}},
			wantFrom: at(10), wantFloors: map[string]time.Time{"3/7": at(10)}},
		{name: "floors of writers the last sweep did not wait for: from final",
			w:        mark(10, 60, []string{}, map[string]int{"3/7": 30}),
			r:        reading{},
			wantFrom: at(10), wantFloors: map[string]time.Time{}, wantDone: true},
		{name: "no sweep completed yet: from final, a new writer's floor final",
			w: watermark{Final: at(10), ProvWait: []string{}, FloorWait: []string{}}, r: reading{Writers: []string{"8/1"}},
			wantFrom: at(10), wantFloors: map[string]time.Time{"8/1": at(10)}, wantDone: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.r.Limit = at(120)
			w := startSweep(c.w, at(120), c.r)
			require.True(t, c.wantFrom.Equal(w.Sweep.AfterDue), "from %s", w.Sweep.AfterDue)
			require.Equal(t, c.wantDone, w.Sweep.PrevDone, "the last sweep's writers all gone")
			require.Len(t, w.FloorAt, len(w.FloorWait))
			got := map[string]time.Time{}
			for i, v := range w.FloorWait {
				got[v] = w.FloorAt[i]
			}
			require.Equal(t, c.wantFloors, got)
			require.Equal(t, w.Sweep.Wait, w.FloorWait, "the floors are the sweep's writers'")
			// Completed, the sweep's writers and floors are the next
			// sweep's known floors.
			done := afterPass(w, 0, 10, at(0), 0)
			require.NotNil(t, floorsKnown(done))
		})
	}
}

// setLazyIntake sets the test schema's lazy-intake horizon (nil: off).
func setLazyIntake(tb testing.TB, db *testenv.DB, horizon *time.Duration) {
	tb.Helper()
	_, err := db.Pool.Exec(context.Background(), `UPDATE nudge_lazy_intake SET horizon = $1`, horizon)
	require.NoError(tb, err)
}

func durationPtr(d time.Duration) *time.Duration { return &d }

// scheduleSMS schedules one SMS reminder due at due through pkg/intake.
func scheduleSMS(tb testing.TB, q intake.Querier, key string, due time.Time) {
	tb.Helper()
	res, err := intake.ScheduleMany(context.Background(), q, []intake.Request{smsRequest(key, due)})
	require.NoError(tb, err)
	require.Equal(tb, intake.Created, res[0].Status, key)
}

// smsRequest is the SMS reminder key due at due that these tests schedule.
func smsRequest(key string, due time.Time) intake.Request {
	return intake.Request{Tenant: "tenant-0", Key: key, Channel: reminder.SMS, Recipient: "+14155550100",
		Template: "course-expiry", Data: map[string]any{"course": "Go 101"}, DueAt: due, Deadline: due.Add(24 * time.Hour)}
}

// lazyAndState returns, for key, reminders.lazy and whether it has a state row.
func lazyAndState(tb testing.TB, q intake.Querier, key string) (lazy, state bool) {
	tb.Helper()
	require.NoError(tb, q.QueryRow(context.Background(), `SELECT r.lazy, EXISTS (SELECT 1 FROM reminder_state s
		WHERE s.id = r.id) FROM reminders r WHERE r.key = $1`, key).Scan(&lazy, &state))
	return lazy, state
}

// lostBelowWatermark is the promoter's invariant: no committed reminder
// below the final watermark without its state row.
func lostBelowWatermark(tb testing.TB, db *testenv.DB) int {
	tb.Helper()
	var lost int
	require.NoError(tb, db.Pool.QueryRow(context.Background(), dueOrderSQL("LostBelowWatermark")).Scan(&lost))
	return lost
}

// passer returns a promoter pass up to until (H 3h, passes of 100) that
// must complete its sweep and leave no committed reminder below final
// without its state row.
func passer(t *testing.T, db *testenv.DB, until time.Time) func() Promotion {
	to := passerTo(t, db)
	return func() Promotion {
		t.Helper()
		return to(until)
	}
}

// passerTo is passer with until given to each pass.
func passerTo(t *testing.T, db *testenv.DB) func(until time.Time) Promotion {
	st := New(db.Pool)
	return func(until time.Time) Promotion {
		t.Helper()
		p, err := st.Promote(context.Background(), until, 3*time.Hour, 100)
		require.NoError(t, err)
		require.True(t, p.SweepDone)
		require.Zero(t, lostBelowWatermark(t, db), "reminders below the final watermark %s without a state row", p.Final)
		return p
	}
}

// The promoter's race with intake, on the real statements: a web
// transaction that wrote a lazy reminder and commits after passes scanned
// its due time. Its sweep's writers are waited for: the final watermark
// stays until a sweep that began after its commit scanned the range again,
// and that sweep promotes it. After every pass no committed reminder lies
// below the final watermark without its state row. A promoter that moved
// final to each sweep's end (or ignored the writers) would leave the
// late reminder below it: the check after the commit's pass catches that.
func TestPromoterRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	setLazyIntake(t, db, durationPtr(2*time.Hour))
	t0 := time.Now().UTC().Truncate(time.Second)
	var f0 time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT final_until FROM nudge_promoter`).Scan(&f0))

	// The web transaction: its reminder, lazy (due 2h10m ahead), not committed.
	web, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer web.Rollback(ctx) //nolint:errcheck
	scheduleSMS(t, web, "late-commit", t0.Add(2*time.Hour+10*time.Minute))
	// Another, committed before the promoter runs.
	scheduleSMS(t, db.Pool, "committed", t0.Add(2*time.Hour+20*time.Minute))
	lazy, state := lazyAndState(t, db.Pool, "committed")
	require.True(t, lazy)
	require.False(t, state, "lazy intake left the state row out")
	// A pass reaches at most the database's clock plus the horizon: widened
	// here so that passes reach the two now, where production waits ten
	// minutes of real time. No other transaction writes this schema's
	// reminders, so the widening races nothing.
	setLazyIntake(t, db, durationPtr(4*time.Hour))

	until := t0.Add(3 * time.Hour)
	step := passer(t, db, until)
	p := step()
	require.EqualValues(t, 1, p.Promoted, "the committed reminder promoted")
	require.True(t, p.Final.Equal(f0), "final stays while the first sweep is provisional: %s", p.Final)
	require.True(t, p.Through.IsZero(), "no lazy reminder due past the sweep: nothing bounds the claim (%s)", p.Through)
	p = step()
	require.Zero(t, p.Promoted)
	require.True(t, p.Final.Equal(f0), "the web transaction is in flight: final stays (%s)", p.Final)
	// (Until schema 46 this sweep re-read the committed one: every sweep
	// started at final.)
	require.Zero(t, p.Read, "the web transaction in flight: nothing re-scanned, the sweep starts at the last one's end")
	lazy, state = lazyAndState(t, web, "late-commit")
	require.True(t, lazy)
	require.False(t, state, "not promoted while in flight")

	require.NoError(t, web.Commit(ctx))
	// The next sweep began after the commit: it scans the range again,
	// promotes the late reminder, and moves final over it.
	p = step()
	require.EqualValues(t, 1, p.Promoted, "the late commit promoted")
	require.Equal(t, 2, p.Read, "its writer gone: the range from its floor (final) scanned again")
	require.True(t, p.Final.Equal(until), "final %s", p.Final)
	for _, key := range []string{"late-commit", "committed"} {
		_, state = lazyAndState(t, db.Pool, key)
		require.True(t, state, key)
	}
	p = step()
	require.Zero(t, p.Promoted, "promoted once")
}

// Intake with lazy intake on leaves the state row out only for a reminder
// due at least the horizon ahead; the promoter inserts exactly those, once,
// as intake would have written them, in bounded passes.
func TestPromoteOnceAndOnlyTheLazy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	st := New(db.Pool)
	setLazyIntake(t, db, durationPtr(2*time.Hour))
	now := time.Now().UTC().Truncate(time.Second)
	scheduleSMS(t, db.Pool, "soon", now.Add(time.Hour))
	for i := range 5 {
		scheduleSMS(t, db.Pool, fmt.Sprintf("lazy:%d", i), now.Add(3*time.Hour+time.Duration(i)*time.Minute))
	}
	scheduleSMS(t, db.Pool, "later", now.Add(48*time.Hour))
	lazy, state := lazyAndState(t, db.Pool, "soon")
	require.False(t, lazy)
	require.True(t, state, "due within the horizon: its state row at intake")
	lazy, state = lazyAndState(t, db.Pool, "lazy:0")
	require.True(t, lazy)
	require.False(t, state)

	setLazyIntake(t, db, durationPtr(5*time.Hour)) // passes reach 3h ahead now (see TestPromoterRace)
	until := now.Add(4 * time.Hour)
	var passes []Promotion
	for len(passes) < 10 {
		p, err := st.Promote(ctx, until, 5*time.Hour, 2)
		require.NoError(t, err)
		require.LessOrEqual(t, p.Read, 2)
		require.Zero(t, lostBelowWatermark(t, db))
		passes = append(passes, p)
		if p.SweepDone {
			break
		}
		require.True(t, p.Through.Before(until), "a sweep in progress bounds the claim: %s", p.Through)
	}
	require.Len(t, passes, 3, "5 lazy reminders in passes of 2")
	var promoted int64
	for _, p := range passes {
		promoted += p.Promoted
	}
	require.EqualValues(t, 5, promoted)
	require.True(t, passes[2].Through.Equal(until), "the later reminder bounds the claim at the sweep's end")
	p, err := st.Promote(ctx, until, 5*time.Hour, 2)
	require.NoError(t, err)
	require.Zero(t, p.Promoted, "promoted once")
	_, state = lazyAndState(t, db.Pool, "later")
	require.False(t, state, "beyond the sweep")

	// A promoted row is the state row intake would have written.
	var got, want string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT row(s.tenant, s.channel, s.state, s.fence, s.due_at, s.deadline,
		s.tz, s.window_open, s.window_close, s.window_days, s.requested_due_at, s.attempts)::text
		FROM reminder_state s JOIN reminders r ON r.id = s.id WHERE r.key = 'lazy:3'`).Scan(&got))
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT row(s.tenant, s.channel, s.state, s.fence,
		s.due_at + interval '2 hours 3 minutes', s.deadline + interval '2 hours 3 minutes',
		s.tz, s.window_open, s.window_close, s.window_days, s.requested_due_at, s.attempts)::text
		FROM reminder_state s JOIN reminders r ON r.id = s.id WHERE r.key = 'soon'`).Scan(&want))
	require.Equal(t, want, got)

	// ClaimDue claims promoted reminders as any other.
	at := now.Add(3*time.Hour + 90*time.Second)
	claimed, err := st.ClaimDue(ctx, at, at, 10, time.Minute, "d")
	require.NoError(t, err)
	var keys []string
	for _, c := range claimed {
		var key string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT key FROM reminders WHERE id = $1`, c.ID).Scan(&key))
		keys = append(keys, key+" "+string(c.State))
	}
	require.ElementsMatch(t, []string{"soon enqueued", "lazy:0 enqueued", "lazy:1 enqueued"}, keys)
}

// With lazy intake off (schema 38 leaves it off; an operator turns it off
// again after 44 turned it on) a pass finds nothing, and bounds no claim.
func TestPromoteWithLazyIntakeOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	setLazyIntake(t, db, nil)
	now := time.Now().UTC()
	scheduleSMS(t, db.Pool, "later", now.Add(48*time.Hour))
	lazy, state := lazyAndState(t, db.Pool, "later")
	require.False(t, lazy)
	require.True(t, state)
	p, err := New(db.Pool).Promote(ctx, now.Add(time.Hour), time.Hour, 100)
	require.NoError(t, err)
	require.Equal(t, Promotion{Final: p.Final, SweepDone: true, From: p.From}, p)
	require.True(t, p.ClaimCutoff(now.Add(72*time.Hour)).Equal(now.Add(72*time.Hour)))
}

// Two web transactions open: once one commits, the next sweep promotes its
// reminder though the other is still open, and final stays until that one
// commits too; a sweep meanwhile re-scans only from the floor of a writer
// that is gone (until schema 46, the range from final every time: the cost
// BenchmarkPromoterUnderLongTransaction measures). After every pass no
// committed reminder lies below final without its state row.
func TestPromoterUnderTwoWebTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.Postgres(t)
	setLazyIntake(t, db, durationPtr(2*time.Hour))
	var webs []pgx.Tx
	t0 := time.Now().UTC().Truncate(time.Second)
	for i := range 2 {
		web, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer web.Rollback(ctx) //nolint:errcheck
		scheduleSMS(t, web, fmt.Sprintf("web-%d", i), t0.Add(2*time.Hour+time.Duration(10+i)*time.Minute))
		webs = append(webs, web)
	}
	setLazyIntake(t, db, durationPtr(4*time.Hour)) // as in TestPromoterRace
	until := t0.Add(3 * time.Hour)
	step := passer(t, db, until)
	state := func(key string) bool {
		_, s := lazyAndState(t, db.Pool, key)
		return s
	}
	f0 := step().Final
	require.Zero(t, step().Read, "both in flight: nothing visible")

	require.NoError(t, webs[0].Commit(ctx))
	p := step()
	require.EqualValues(t, 1, p.Promoted, "one committed: its reminder promoted")
	require.True(t, state("web-0"))
	require.True(t, p.Final.Equal(f0), "the other is in flight: final stays (%s)", p.Final)
	p = step()
	require.Zero(t, p.Read, "the other in flight: nothing re-scanned (until schema 46: web-0's again)")
	require.True(t, p.Final.Equal(f0), "final stays (%s)", p.Final)

	require.NoError(t, webs[1].Commit(ctx))
	p = step()
	require.EqualValues(t, 1, p.Promoted)
	require.True(t, state("web-1"))
	p = step()
	require.True(t, p.Final.Equal(until), "both gone: final moves (%s)", p.Final)
}

// planNodes lists every node of a plan as "Node Type relation index".
func planNodes(n planNode, into *[]string) {
	*into = append(*into, strings.TrimSpace(n.NodeType+" "+n.Relation+" "+n.Index))
	for _, p := range n.Plans {
		planNodes(p, into)
	}
}

// A promoter pass runs before every claim of a loop at --min-gap, lazy
// reminders or not: its "is any lazy reminder due at or past until" must
// read the first entry of reminders_due_order past until, not the table.
// An EXISTS there was planned, on a table without statistics (just after a
// bulk intake) and no lazy row, as a sequential scan of reminders (the
// planner drops an EXISTS subquery's ORDER BY and LIMIT): every row read on
// each pass.
func TestPromoteBeyondReadsTheDueOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		lazy    string // which of the 20,000 rows are lazy
		analyze bool
	}{
		{name: "no statistics, none lazy", lazy: "false"},
		{name: "analyzed, none lazy", lazy: "false", analyze: true},
		{name: "analyzed, one in 1,000 lazy", lazy: "i % 1000 = 0", analyze: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testenv.Postgres(t)
			now := time.Now()
			_, err := db.Pool.Exec(ctx, `INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at,
				deadline, idempotency_key, lazy)
				SELECT 'tenant-' || i % 4, 'beyond:' || i, 'sms', '+1415' || lpad(i::text, 7, '0'), 'course-expiry', '{}',
				       $1::timestamptz + i * interval '1 second', $1::timestamptz + interval '1 day', 'beyond-' || i, `+
				tc.lazy+`
				  FROM generate_series(1, 20000) i`, now)
			require.NoError(t, err)
			if tc.analyze {
				_, err = db.Pool.Exec(ctx, `ANALYZE reminders`)
				require.NoError(t, err)
			}
			var raw []byte
			require.NoError(t, db.Pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+query("Promote"), pgx.NamedArgs{
				"after_due": now, "after_id": int64(0), "until": now.Add(time.Hour), "limit": 5000}).Scan(&raw))
			var out []explained
			require.NoError(t, json.Unmarshal(raw, &out))
			var nodes, onReminders []string
			planNodes(out[0].Plan, &nodes)
			for _, n := range nodes {
				if f := strings.Fields(n); len(f) >= 2 && f[len(f)-2] == "reminders" || strings.HasSuffix(n, " reminders") {
					onReminders = append(onReminders, n)
				}
			}
			require.NotContains(t, onReminders, "Seq Scan reminders", "%q", nodes)
			require.Len(t, onReminders, 2, "the sweep's scan and the look past until: %q", nodes)
			require.Contains(t, []string{"Index Only Scan reminders reminders_due_order", "Index Scan reminders reminders_due_order"},
				onReminders[1], "the look past until reads the due order's first entry: %q", nodes)
		})
	}
}
