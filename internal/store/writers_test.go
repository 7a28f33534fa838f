package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
)

// The promoter's race with intake (TestPromoterRace, floor_test.go) under
// many writers at once, randomized: 8 to 16 goroutines schedule reminders,
// in three bursts with a lull between (so final moves while the run goes
// on), through pkg/intake in their own transactions (short and long, one or two
// statements, some rolled back, some held open until a completed sweep has
// passed their reminders' due times and committed only then: the case the
// writers' floors exist for), while one or two promoter loops run
// Store.Promote as dispatchers do. After every pass no committed reminder
// lies below the final watermark without its state row; at the end, once
// final has passed every due time, every committed reminder has exactly one
// state row (written by intake or inserted once by the promoter), and no
// rolled-back one has any.
//
// Time: a pass's until comes from a fake clock that each loop moves (ahead,
// back, or resynced), but a sweep never reaches past the database's clock
// plus the horizon, and intake decides laziness on the database's clock
// (clock_timestamp()): that bound is the race argument, so no fake clock
// may lift it. The lazy reminders are therefore due only a fraction of a
// second past the horizon, and the run waits that long in real time.
//
// NUDGE_WRITERS_SEED=<n> replays a run's plans (the schedule of the
// goroutines, and so the interleaving, is the machine's).

// writersHorizon is lazy intake's horizon (schema 44's default) and the
// promoter's H in this test, so a pass reaches the database's clock plus it.
const writersHorizon = 2 * time.Hour

// writersSeed is NUDGE_WRITERS_SEED, or the time when it is not set.
func writersSeed(t *testing.T) uint64 {
	if s := os.Getenv("NUDGE_WRITERS_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "NUDGE_WRITERS_SEED")
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// txPlan is one writer transaction. Each reminder's due time is given as an
// offset from the writer's clock plus the horizon: negative is due within
// the horizon (intake writes its state row), positive lazy (unless the
// insert reaches the database later than the offset: intake decides on its
// clock, and the checks read what it decided).
type txPlan struct {
	batches  [][]time.Duration // one ScheduleMany per batch
	pause    time.Duration     // slept after each batch: the transaction stays open across passes
	straddle bool              // held until a completed sweep has passed its lazy due times
	commit   bool
}

// dueOffset draws a reminder's offset past the horizon: mostly lazy and
// due within a second (so real time reaches them in the run), some due
// well within the horizon, some on its edge (laziness decided by the
// database's clock at the insert, either way).
func dueOffset(rng *rand.Rand) time.Duration {
	switch r := rng.IntN(100); {
	case r < 15:
		return -time.Second - upTo(rng, 30*time.Minute)
	case r < 25:
		return upTo(rng, 40*time.Millisecond) - 20*time.Millisecond
	default:
		return 100*time.Millisecond + upTo(rng, 900*time.Millisecond)
	}
}

// planTx draws a writer transaction.
func planTx(rng *rand.Rand) txPlan {
	p := txPlan{commit: rng.IntN(100) >= 20, straddle: rng.IntN(100) < 20}
	for range 1 + rng.IntN(2) {
		batch := make([]time.Duration, 1+rng.IntN(4))
		for i := range batch {
			batch[i] = dueOffset(rng)
		}
		p.batches = append(p.batches, batch)
	}
	if rng.IntN(2) == 0 {
		p.pause = upTo(rng, 250*time.Millisecond)
	}
	return p
}

// straddler is the first transaction of writer 0 in each burst: committed
// after a sweep passed its reminder, so every run has late commits.
var straddler = txPlan{batches: [][]time.Duration{{300 * time.Millisecond}}, straddle: true, commit: true}

// stepClock moves a promoter's fake clock for its next pass: mostly ahead
// by a little, sometimes back (a sweep must still reach the last one's
// end), sometimes to real time give or take (until then bounded by the
// database's clock, or short of it).
func stepClock(clock, real time.Time, rng *rand.Rand) time.Time {
	switch r := rng.IntN(100); {
	case r < 80:
		return clock.Add(upTo(rng, 60*time.Millisecond))
	case r < 90:
		return clock.Add(-upTo(rng, 300*time.Millisecond))
	default:
		return real.Add(upTo(rng, 1200*time.Millisecond) - 200*time.Millisecond)
	}
}

// sweepProgress is the end of the last complete sweep the promoter loops
// saw (nudge_promoter.prov_until, which never goes back); a straddling
// writer waits on it.
type sweepProgress struct {
	mu      sync.Mutex
	end     time.Time
	changed chan struct{} // closed and replaced at each move
}

func (s *sweepProgress) get() (time.Time, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.end, s.changed
}

func (s *sweepProgress) set(end time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if end.After(s.end) {
		s.end = end
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// waitPast waits until a complete sweep ended after t, at most max;
// false: it did not.
func (s *sweepProgress) waitPast(ctx context.Context, t time.Time, max time.Duration) bool {
	timeout := time.NewTimer(max)
	defer timeout.Stop()
	for {
		end, changed := s.get()
		if end.After(t) {
			return true
		}
		select {
		case <-changed:
		case <-timeout.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// writersRun is one run's shared state and tallies.
type writersRun struct {
	writers  *pgxpool.Pool // a connection per writer: none waits for another's
	db       *testenv.DB   // the promoters' and checks' pool
	st       *Store
	progress sweepProgress

	mu         sync.Mutex
	committed  []int64 // reminder ids
	rolledBack []int64
	late       []int64 // committed after a complete sweep passed their due time
	maxDue     time.Time
	txs        map[string]int // transactions committed, rolled back, straddled, straddled and timed out
	passes     int
	finalMoves int // while writers ran
	lastFinal  time.Time
	sweeps     int
	read       int
	promoted   int64
}

func (h *writersRun) count(what string) {
	h.mu.Lock()
	h.txs[what]++
	h.mu.Unlock()
}

// writer runs writer i's transactions of burst b, drawn in turn from rng,
// until stop.
func (h *writersRun) writer(ctx context.Context, b, i int, rng *rand.Rand, stop time.Time) error {
	for n := 0; time.Now().Before(stop) && ctx.Err() == nil; n++ {
		plan := planTx(rng)
		if i == 0 && n == 0 {
			plan = straddler
		}
		if err := h.runTx(ctx, fmt.Sprintf("p%d-w%d-t%d", b, i, n), plan); err != nil {
			return fmt.Errorf("burst %d, writer %d, transaction %d: %w", b, i, n, err)
		}
	}
	return nil
}

// runTx runs one planned transaction through pkg/intake and records its
// reminders as committed (late or not) or rolled back.
func (h *writersRun) runTx(ctx context.Context, name string, plan txPlan) error {
	tx, err := h.writers.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
	var ids []int64
	var dues []time.Time
	var lastLazy time.Time
	for b, batch := range plan.batches {
		now := time.Now()
		reqs := make([]intake.Request, len(batch))
		for k, off := range batch {
			due := now.Add(writersHorizon + off).Truncate(time.Microsecond) // PostgreSQL's resolution
			reqs[k] = smsRequest(fmt.Sprintf("%s-b%d-%d", name, b, k), due)
			if off > 0 && due.After(lastLazy) {
				lastLazy = due
			}
		}
		out, err := intake.ScheduleMany(ctx, tx, reqs)
		if err != nil {
			return err
		}
		for k, o := range out {
			if o.Err != nil || o.Status != intake.Created {
				return fmt.Errorf("%s: %s %v", reqs[k].Key, o.Status, o.Err)
			}
			ids, dues = append(ids, o.ID), append(dues, reqs[k].DueAt)
		}
		if err := sleepCtx(ctx, plan.pause); err != nil {
			return err
		}
	}
	if plan.straddle && !lastLazy.IsZero() {
		h.count("straddled")
		if !h.progress.waitPast(ctx, lastLazy, 5*time.Second) {
			h.count("straddle timed out")
		}
	}
	swept, _ := h.progress.get() // a sweep that ended before the commit saw none of these
	end := tx.Commit
	if !plan.commit {
		end = tx.Rollback
	}
	if err := end(ctx); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !plan.commit {
		h.rolledBack = append(h.rolledBack, ids...)
		h.txs["rolled back"]++
		return nil
	}
	h.committed = append(h.committed, ids...)
	h.txs["committed"]++
	for k, due := range dues {
		if due.Before(swept) {
			h.late = append(h.late, ids[k])
		}
		if due.After(h.maxDue) {
			h.maxDue = due
		}
	}
	return nil
}

// promoter runs passes until stop is closed, at the pace of a dispatcher
// loop at a --min-gap of a few milliseconds, each with its own fake clock
// and limit (so sweeps span passes and resume at their cursor while
// writers commit).
func (h *writersRun) promoter(ctx context.Context, rng *rand.Rand, stop <-chan struct{}) error {
	clock := time.Now()
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		clock = stepClock(clock, time.Now(), rng)
		if _, err := h.pass(ctx, clock.Add(writersHorizon), 1+rng.IntN(60)); err != nil {
			return err
		}
		if err := sleepCtx(ctx, upTo(rng, 20*time.Millisecond)); err != nil {
			return err
		}
	}
}

// pass runs one promoter pass, checks the invariant after it, and
// publishes the last complete sweep's end.
func (h *writersRun) pass(ctx context.Context, until time.Time, limit int) (Promotion, error) {
	p, err := h.st.Promote(ctx, until, writersHorizon, limit)
	if err != nil {
		return p, err
	}
	h.mu.Lock()
	h.passes++
	h.read += p.Read
	h.promoted += p.Promoted
	if p.SweepDone {
		h.sweeps++
	}
	if p.Final.After(h.lastFinal) {
		if !h.lastFinal.IsZero() {
			h.finalMoves++
		}
		h.lastFinal = p.Final
	}
	h.mu.Unlock()
	if lost, err := lostReminders(ctx, h.db.Pool); err != nil || len(lost) > 0 {
		return p, errors.Join(err, fmt.Errorf("after a pass (final %s): committed reminders below the final watermark "+
			"without a state row: %v", p.Final, lost))
	}
	var end *time.Time
	if err := h.db.Pool.QueryRow(ctx, `SELECT prov_until FROM nudge_promoter`).Scan(&end); err != nil {
		return p, err
	}
	if end != nil {
		h.progress.set(*end)
	}
	return p, nil
}

// lostReminders lists (up to 5) the committed reminders below the final
// watermark without a state row (testdata/dueorder.sql's
// LostBelowWatermark, with what the failure needs to say).
func lostReminders(ctx context.Context, q intake.Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT r.key || ' due ' || r.due_at || ' lazy ' || r.lazy FROM reminders r, nudge_promoter p
		WHERE r.due_at < p.final_until AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)
		ORDER BY r.due_at LIMIT 5`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// writerTally is what the final check reads, in one snapshot.
type writerTally struct {
	Reminders, Lazy, States     int // rows of reminders, of which lazy; of reminder_state
	Missing                     int // committed reminders without a state row
	RolledBackRows              int // rolled-back reminders' rows in reminders or reminder_state
	Orphans                     int // state rows of no reminder
	LateLazy                    int // lazy reminders committed after a sweep passed their due time
	MissingKeys, RolledBackKeys []string
}

func TestPromoterUnderManyWriters(t *testing.T) {
	t.Parallel()
	seed := writersSeed(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with NUDGE_WRITERS_SEED=%d", seed)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 0))
	nWriters, nPromoters := 8+rng.IntN(9), 1+rng.IntN(2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()

	db := testenv.Postgres(t)
	setLazyIntake(t, db, durationPtr(writersHorizon))
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.MaxConns = int32(nWriters) //nolint:gosec // at most 16
	writers, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(writers.Close) // before testenv drops the schema
	h := &writersRun{writers: writers, db: db, st: New(db.Pool), txs: map[string]int{},
		progress: sweepProgress{changed: make(chan struct{})}}

	// Writers and promoters together; the first error stops them all (the
	// first cause given to fail is the one context.Cause keeps).
	runCtx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	stopPromoters := make(chan struct{})
	var wg, pwg sync.WaitGroup
	for i := range nPromoters {
		prng := rand.New(rand.NewPCG(seed, uint64(1000+i)))
		pwg.Go(func() {
			if err := h.promoter(runCtx, prng, stopPromoters); err != nil && runCtx.Err() == nil {
				fail(fmt.Errorf("promoter %d: %w", i, err))
			}
		})
	}
	// Intake in bursts: while writers overlap without a break, final stays
	// (some sweep's writer is always in flight) and the check after each
	// pass has little to bite on; in the lull after a burst final catches
	// up with the sweeps, over the late commits of the burst, while the
	// promoters keep running.
	wrngs := make([]*rand.Rand, nWriters)
	for i := range wrngs {
		wrngs[i] = rand.New(rand.NewPCG(seed, uint64(1+i)))
	}
	for b := range 3 {
		stop := time.Now().Add(800 * time.Millisecond)
		for i := range nWriters {
			wg.Go(func() {
				if err := h.writer(runCtx, b, i, wrngs[i], stop); err != nil && runCtx.Err() == nil {
					fail(err)
				}
			})
		}
		wg.Wait()
		if sleepCtx(runCtx, 150*time.Millisecond) != nil {
			break
		}
	}
	close(stopPromoters)
	pwg.Wait()
	h.mu.Lock()
	finalMoves := h.finalMoves
	h.mu.Unlock()
	require.NoError(t, context.Cause(runCtx), "seed %d", seed)

	// No writer left: passes until final passes every due time. Real time
	// must reach the last due time minus the horizon (the database's clock
	// bounds a sweep), then two sweeps: one to scan, one to move final.
	h.mu.Lock()
	maxDue := h.maxDue
	h.mu.Unlock()
	require.False(t, maxDue.IsZero(), "nothing committed (seed %d)", seed)
	deadline := time.Now().Add(time.Until(maxDue.Add(-writersHorizon)) + 10*time.Second)
	var last Promotion
	for !last.Final.After(maxDue) {
		require.True(t, time.Now().Before(deadline), "the final watermark %s did not pass the last due time %s "+
			"(%s after it minus the horizon; seed %d)", last.Final, maxDue, time.Since(maxDue.Add(-writersHorizon)), seed)
		last, err = h.pass(ctx, maxDue.Add(time.Second), 100)
		require.NoError(t, err, "seed %d", seed)
		if !last.Final.After(maxDue) {
			require.NoError(t, sleepCtx(ctx, 10*time.Millisecond))
		}
	}

	var got writerTally
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM reminders), (SELECT count(*) FROM reminders WHERE lazy), (SELECT count(*) FROM reminder_state),
		(SELECT count(*) FROM unnest(@committed::bigint[]) c (id) WHERE NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = c.id)),
		(SELECT count(*) FROM reminders r WHERE r.id = ANY(@rolled_back))
		+ (SELECT count(*) FROM reminder_state s WHERE s.id = ANY(@rolled_back)),
		(SELECT count(*) FROM reminder_state s WHERE NOT EXISTS (SELECT 1 FROM reminders r WHERE r.id = s.id)),
		(SELECT count(*) FROM reminders r WHERE r.lazy AND r.id = ANY(@late)),
		ARRAY(SELECT r.key FROM reminders r WHERE r.id = ANY(@committed)
		       AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id) ORDER BY r.due_at LIMIT 5),
		ARRAY(SELECT r.key FROM reminders r WHERE r.id = ANY(@rolled_back) LIMIT 5)`,
		pgx.NamedArgs{"committed": h.committed, "rolled_back": h.rolledBack, "late": h.late}).Scan(
		&got.Reminders, &got.Lazy, &got.States, &got.Missing, &got.RolledBackRows, &got.Orphans, &got.LateLazy,
		&got.MissingKeys, &got.RolledBackKeys))
	t.Logf("seed %d: %d writers, %d promoter loops, %s; transactions %v; reminders committed %d (%d lazy, "+
		"%d at intake; %d of them lazy and committed after a sweep passed their due time), rolled back %d; "+
		"%d passes, %d sweeps, %d reminders read, %d promoted; final moved %d times while writers ran, "+
		"and ended %s past the last due time",
		seed, nWriters, nPromoters, time.Since(start).Round(time.Millisecond), h.txs, len(h.committed), got.Lazy,
		got.Reminders-got.Lazy, got.LateLazy, len(h.rolledBack), h.passes, h.sweeps, h.read, h.promoted,
		finalMoves, last.Final.Sub(maxDue))

	require.Zero(t, got.Missing, "committed reminders without a state row, e.g. %v (seed %d)", got.MissingKeys, seed)
	require.Zero(t, got.RolledBackRows, "rows of rolled-back reminders, e.g. %v (seed %d)", got.RolledBackKeys, seed)
	require.Zero(t, got.Orphans, "state rows of no reminder (seed %d)", seed)
	require.Equal(t, len(h.committed), got.Reminders, "every committed reminder, and only those (seed %d)", seed)
	require.Equal(t, got.Reminders, got.States, "one state row per reminder (seed %d)", seed)
	require.EqualValues(t, got.Lazy, h.promoted, "each lazy reminder promoted exactly once, the others by intake (seed %d)", seed)
	require.Positive(t, got.LateLazy, "no lazy reminder was committed after a sweep passed it: the run proved "+
		"nothing of the writers' floors (seed %d)", seed)
}

// upTo draws a duration in [0, d) from rng.
func upTo(rng *rand.Rand, d time.Duration) time.Duration { return time.Duration(rng.Int64N(int64(d))) }
