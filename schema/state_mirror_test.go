package schema_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
	"github.com/nudgehq/nudge/schema"
)

// Schema version 32 keeps reminder_state equal to the state columns of
// reminders by triggers, both ways, inside the writing transaction, so that
// the previous release's binaries (which write reminders) and this
// release's (which write reminder_state) see and make the same state during
// a rolling upgrade; version 33 records that the backfill copied every row
// older than 32. These tests check the copies as a reader of either table
// sees them.

// mirrorNow is the time of the rows these tests write.
var mirrorNow = time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)

type mirrorDB struct {
	pool *pgxpool.Pool
	// cols are reminder_state's columns but id: the state columns that
	// both tables have.
	cols []string
}

func setupMirror(t *testing.T) mirrorDB {
	t.Helper()
	db := testenv.PostgresBeforeRollout(t)
	m := mirrorDB{pool: db.Pool}
	rows, err := db.Pool.Query(context.Background(), `SELECT attname FROM pg_attribute
		WHERE attrelid = 'reminder_state'::regclass AND attnum > 0 AND NOT attisdropped AND attname <> 'id'
		ORDER BY attnum`)
	require.NoError(t, err)
	m.cols, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Subset(t, m.cols, []string{"tenant", "state", "fence", "due_at", "deadline", "window_days"})
	return m
}

// schedule records reminders through pkg/intake (nudge_schedule and its
// batch form) and returns their ids.
func (m mirrorDB) schedule(t *testing.T, reqs ...intake.Request) []int64 {
	t.Helper()
	out, err := intake.ScheduleMany(context.Background(), m.pool, reqs)
	require.NoError(t, err)
	ids := make([]int64, len(out))
	for i, o := range out {
		require.NoError(t, o.Err)
		ids[i] = o.ID
	}
	return ids
}

// pending returns n plain requests keyed prefix-0..n-1, due before mirrorNow.
func pending(prefix string, n int) []intake.Request {
	reqs := make([]intake.Request, n)
	for i := range reqs {
		reqs[i] = intake.Request{Tenant: "acme", Key: fmt.Sprintf("%s-%d", prefix, i), Channel: reminder.Email,
			Recipient: "a@example.com", Template: "course-expiry", DueAt: mirrorNow.Add(-time.Minute),
			Deadline: mirrorNow.Add(time.Hour)}
	}
	return reqs
}

// diff compares the two tables column by column and says what differs:
// the reminders without a state row, and per state column the rows whose
// two copies are not the same. Empty when the copies are equal.
func (m mirrorDB) diff(t *testing.T) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	var missing int
	require.NoError(t, m.pool.QueryRow(ctx, `SELECT count(*) FROM reminders r
		WHERE NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)`).Scan(&missing))
	if missing > 0 {
		out = append(out, fmt.Sprintf("%d reminders without a state row", missing))
	}
	counts := make([]string, len(m.cols))
	for i, c := range m.cols {
		counts[i] = fmt.Sprintf("count(*) FILTER (WHERE r.%[1]s IS DISTINCT FROM s.%[1]s)", pgx.Identifier{c}.Sanitize())
	}
	n := make([]int64, len(m.cols))
	dest := make([]any, len(n))
	for i := range n {
		dest[i] = &n[i]
	}
	require.NoError(t, m.pool.QueryRow(ctx, `SELECT `+strings.Join(counts, ", ")+`
		FROM reminders r JOIN reminder_state s USING (id)`).Scan(dest...))
	for i, c := range m.cols {
		if n[i] > 0 {
			out = append(out, fmt.Sprintf("%s differs in %d rows", c, n[i]))
		}
	}
	return out
}

// xmin is the transaction that wrote the current version of a row of
// table: unchanged when nothing rewrote it.
func (m mirrorDB) xmin(t *testing.T, table string, id int64) string {
	t.Helper()
	var x string
	require.NoError(t, m.pool.QueryRow(context.Background(),
		`SELECT xmin::text FROM `+pgx.Identifier{table}.Sanitize()+` WHERE id = $1`, id).Scan(&x))
	return x
}

// hasState reports whether reminder id has its state row.
func (m mirrorDB) hasState(t *testing.T, id int64) bool {
	t.Helper()
	var ok bool
	require.NoError(t, m.pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM reminder_state WHERE id = $1)`, id).Scan(&ok))
	return ok
}

func TestMirrorInsertCreatesTheEqualStateRow(t *testing.T) {
	t.Parallel()
	m := setupMirror(t)
	ctx := context.Background()
	window, err := localtime.ParseWindow("mon-fri 08:00-21:00")
	require.NoError(t, err)

	for _, c := range []struct {
		name   string
		insert func(t *testing.T) []int64
		// check is a predicate on the state rows that the copy must satisfy
		// (columns that the insert set, not the defaults).
		check string
	}{
		{"nudge_schedule, one reminder", func(t *testing.T) []int64 {
			return m.schedule(t, pending("one", 1)...)
		}, "state = 'pending' AND tenant = 'acme' AND channel = 'email' AND deadline = due_at + interval '61 minutes'"},
		{"a batch of intake, local time and a send window", func(t *testing.T) []int64 {
			reqs := pending("local", 3)
			for i := range reqs {
				reqs[i].TZ, reqs[i].Window = "Europe/Stockholm", &window
				reqs[i].DueAt, reqs[i].DueLocal = time.Time{}, "2026-12-07T09:00"
				reqs[i].Deadline, reqs[i].DeadlineLocal = time.Time{}, "2026-12-07T18:00"
			}
			return m.schedule(t, reqs...)
		}, "tz = 'Europe/Stockholm' AND window_open = '08:00' AND window_close = '21:00' AND window_days IS NOT NULL"},
		{"an INSERT of reminders with state columns set (as an older release's statements or a fixture)",
			func(t *testing.T) []int64 {
				rows, err := m.pool.Query(ctx, `INSERT INTO reminders (tenant, key, channel, recipient, template,
					due_at, deadline, idempotency_key, state, fence, attempts, lease_until, reason, last_error,
					requested_due_at, claimed_at, claimed_fence, claimed_by)
				SELECT 'acme', 'raw-' || g, 'sms', '+14155550100', 'course-expiry', $1, $1::timestamptz + interval '1 hour',
				       'idem-raw-' || g, 'retrying', 3, 2, NULL, 'provider said 503', 'HTTP 503', $1::timestamptz - interval '1 day',
				       $1, 1, 'd'
				  FROM generate_series(1, 4) g RETURNING id`, mirrorNow)
				require.NoError(t, err)
				ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
				require.NoError(t, err)
				return ids
			}, "state = 'retrying' AND fence = 3 AND attempts = 2 AND last_error = 'HTTP 503' AND claimed_by = 'd'"},
	} {
		ids := c.insert(t)
		require.NotEmpty(t, ids, c.name)
		var n int
		require.NoError(t, m.pool.QueryRow(ctx, `SELECT count(*) FROM reminder_state WHERE id = ANY($1) AND `+c.check,
			ids).Scan(&n))
		require.Equal(t, len(ids), n, "%s: each insert has its state row, with what the insert set", c.name)
		require.Empty(t, m.diff(t), c.name)
	}
}

// Each write of state columns is copied to the other table in the same
// statement; a write that changes no state column, or writes the values
// the row already has, does not rewrite the other table's row.
func TestMirrorUpdatesCopyStateBothWaysAndOnlyWhenItChanges(t *testing.T) {
	t.Parallel()
	m := setupMirror(t)
	ctx := context.Background()
	for i, c := range []struct {
		name  string
		table string // the table the statement writes
		set   string // its SET clause; $1 is mirrorNow
		// copied: the other table's row is rewritten (and must then be
		// equal); otherwise it must be left as it was.
		copied bool
	}{
		{"a dispatcher's claim through reminders", "reminders",
			"state = 'enqueued', fence = fence + 1, lease_until = $1::timestamptz + interval '1 minute', enqueued_at = $1, " +
				"dispatch_batch = 7, claimed_at = $1, claimed_fence = fence + 1, claimed_by = 'd', updated_at = $1", true},
		{"a retry through reminders", "reminders",
			"state = 'retrying', attempts = attempts + 1, next_attempt_at = $1::timestamptz + interval '30 seconds', " +
				"reason = 'provider said 503', last_error = 'HTTP 503', updated_at = $1", true},
		{"a reschedule through reminders", "reminders",
			"due_at = $1::timestamptz + interval '1 day', deadline = $1::timestamptz + interval '2 days', requested_due_at = $1, " +
				"tz = 'Europe/Stockholm', window_open = '08:00', window_close = '21:00', window_days = 31", true},
		{"a worker's claim through reminder_state", "reminder_state",
			"state = 'sending', fence = fence + 1, started_at = $1, started_fence = fence + 1, started_by = 'w', " +
				"lease_until = $1::timestamptz + interval '2 minutes', republishes = republishes + 1", true},
		{"a delivery through reminder_state", "reminder_state",
			"state = 'delivered', finished_at = $1, delivered_by = 'w', reason = 'delivered', lease_until = NULL", true},
		{"retention's purge mark through reminder_state", "reminder_state", "purged_at = $1", true},
		{"the payload only, through reminders", "reminders", `data = '{"course": "Mirrors 102"}'`, false},
		{"the recipient and template, through reminders", "reminders",
			"recipient = 'b@example.com', template = 'renewal'", false},
		{"state columns to the values they hold, through reminders", "reminders",
			"state = state, fence = fence, reason = reason, updated_at = updated_at", false},
		{"state columns to the values they hold, through reminder_state", "reminder_state",
			"state = state, fence = fence, lease_until = lease_until", false},
	} {
		id := m.schedule(t, pending(fmt.Sprint("update-", i), 1)...)[0]
		other := map[string]string{"reminders": "reminder_state", "reminder_state": "reminders"}[c.table]
		before := m.xmin(t, other, id)
		tag, err := m.pool.Exec(ctx, `UPDATE `+c.table+` SET `+c.set+` WHERE id = $2 AND $1::timestamptz IS NOT NULL`,
			mirrorNow, id)
		require.NoError(t, err, c.name)
		require.EqualValues(t, 1, tag.RowsAffected(), c.name)
		if c.copied {
			require.NotEqual(t, before, m.xmin(t, other, id), "%s: copied to %s", c.name, other)
		} else {
			require.Equal(t, before, m.xmin(t, other, id), "%s: %s not rewritten", c.name, other)
		}
		require.Empty(t, m.diff(t), c.name)
	}

	// The comparison sees a copy that did not happen: with triggers off
	// (a replica's session), a state write to one table only.
	id := m.schedule(t, pending("unmirrored", 1)...)[0]
	tx, err := m.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // after the checks
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE reminders SET state = 'canceled', reason = 'x' WHERE id = $1`, id)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []string{"state differs in 1 rows", "reason differs in 1 rows"}, m.diff(t))
}

func TestMirrorDeleteOfAReminderDeletesItsStateRow(t *testing.T) {
	t.Parallel()
	m := setupMirror(t)
	ids := m.schedule(t, pending("del", 2)...)
	require.True(t, m.hasState(t, ids[0]))
	_, err := m.pool.Exec(context.Background(), `DELETE FROM reminders WHERE id = $1`, ids[0])
	require.NoError(t, err)
	require.False(t, m.hasState(t, ids[0]), "the deleted reminder's state row is gone")
	require.True(t, m.hasState(t, ids[1]), "the other's stays")
	require.Empty(t, m.diff(t))
}

// The backfill (run by schema.Migrate before migration 33) copies the
// reminders that have no state row, the ones older than migration 32, in
// batches by id: a run stopped after some batches is finished by the next,
// and a run over complete tables rewrites nothing.
func TestMirrorBackfillCopiesMissingRowsResumably(t *testing.T) {
	t.Parallel()
	m := setupMirror(t)
	ctx := context.Background()
	ids := m.schedule(t, pending("old", 12)...)
	// Rows in other states than pending, as the previous release left them.
	_, err := m.pool.Exec(ctx, `UPDATE reminders SET state = 'delivered', fence = 2, finished_at = $1,
		delivered_by = 'w', reason = 'delivered' WHERE id = ANY($2)`, mirrorNow, ids[:4])
	require.NoError(t, err)
	_, err = m.pool.Exec(ctx, `UPDATE reminders SET state = 'enqueued', fence = 1, lease_until = $1,
		claimed_at = $1, claimed_fence = 1, claimed_by = 'd' WHERE id = ANY($2)`, mirrorNow, ids[4:8])
	require.NoError(t, err)

	// As before migration 32: every other reminder without its state row.
	var gone []int64
	for i, id := range ids {
		if i%2 == 0 {
			gone = append(gone, id)
		}
	}
	_, err = m.pool.Exec(ctx, `DELETE FROM reminder_state WHERE id = ANY($1)`, gone)
	require.NoError(t, err)
	require.Equal(t, []string{"6 reminders without a state row"}, m.diff(t))

	// A write of the old release meanwhile: the forward trigger has no row
	// to update and creates none; the backfill will copy the newer values.
	_, err = m.pool.Exec(ctx, `UPDATE reminders SET state = 'canceled', reason = 'canceled meanwhile',
		finished_at = $1 WHERE id = $2`, mirrorNow, gone[5])
	require.NoError(t, err)
	require.False(t, m.hasState(t, gone[5]))

	// One batch of 5, as a run that stopped after it: the missing rows
	// among the first 5 ids are copied, no others.
	kept := m.xmin(t, "reminder_state", ids[1])
	var last *int64
	require.NoError(t, m.pool.QueryRow(ctx, schema.BackfillStatement,
		pgx.NamedArgs{"after": int64(0), "size": 5}).Scan(&last))
	require.NotNil(t, last)
	require.Equal(t, ids[4], *last, "the last id of the batch")
	require.Equal(t, []string{"3 reminders without a state row"}, m.diff(t))
	require.Equal(t, kept, m.xmin(t, "reminder_state", ids[1]), "a state row already there is not rewritten")

	// The next run finishes the copy: the tables are equal column by column.
	require.NoError(t, schema.BackfillState(ctx, m.pool))
	require.Empty(t, m.diff(t))
	var state, reason string
	require.NoError(t, m.pool.QueryRow(ctx, `SELECT state, reason FROM reminder_state WHERE id = $1`, gone[5]).
		Scan(&state, &reason))
	require.Equal(t, []string{"canceled", "canceled meanwhile"}, []string{state, reason})

	// Run again over complete tables: nothing is rewritten.
	xmins := map[int64]string{}
	for _, id := range ids {
		xmins[id] = m.xmin(t, "reminder_state", id)
	}
	require.NoError(t, schema.BackfillState(ctx, m.pool))
	for _, id := range ids {
		require.Equal(t, xmins[id], m.xmin(t, "reminder_state", id), "reminder %d rewritten by a second run", id)
	}
	require.Empty(t, m.diff(t))
}

// The backfill runs under the previous release's fleet, which keeps writing
// reminders. A write to a row without its state row, committed while the
// backfill's batch copies that row, must not be lost: the forward trigger
// finds no state row to update, so the copy must be of the written row.
func TestMirrorBackfillRacingAWriteOfTheOldRelease(t *testing.T) {
	t.Parallel()
	m := setupMirror(t)
	ctx := context.Background()
	ids := m.schedule(t, pending("racing", 3)...)
	_, err := m.pool.Exec(ctx, `DELETE FROM reminder_state WHERE id = ANY($1)`, ids)
	require.NoError(t, err)

	// An old worker's outcome on the middle row, not yet committed.
	w, err := m.pool.Begin(ctx)
	require.NoError(t, err)
	defer w.Rollback(ctx) //nolint:errcheck // committed below
	_, err = w.Exec(ctx, `UPDATE reminders SET state = 'delivered', fence = fence + 2, finished_at = $1,
		delivered_by = 'old-worker', reason = 'delivered' WHERE id = $2`, mirrorNow, ids[1])
	require.NoError(t, err)
	writer := w.Conn().PgConn().PID()

	// The backfill meanwhile: it either waits for the write or copies
	// without it; the write commits once it has done either.
	done := make(chan error, 1)
	go func() { done <- schema.BackfillState(ctx, m.pool) }()
	var finished bool
	var backfillErr error
	require.Eventually(t, func() bool {
		select {
		case backfillErr = <-done:
			finished = true
			return true
		default:
		}
		var waiting int
		err := m.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE $1 = ANY(pg_blocking_pids(pid))`, int(writer)).Scan(&waiting)
		return err == nil && waiting > 0
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, w.Commit(ctx))
	if !finished {
		backfillErr = <-done
	}
	require.NoError(t, backfillErr)
	t.Logf("the backfill waited for the write: %v", !finished)

	require.Empty(t, m.diff(t), "the state rows are the rows as written")
	var state, by string
	require.NoError(t, m.pool.QueryRow(ctx, `SELECT state, delivered_by FROM reminder_state WHERE id = $1`, ids[1]).
		Scan(&state, &by))
	require.Equal(t, []string{"delivered", "old-worker"}, []string{state, by})
}

// The previous release's claim (through reminders) and this release's
// (through reminder_state), both fenced, racing for the same rows: each row
// is moved by exactly one of them, the tables stay equal, and when their
// locks cross (one holds a reminders row the other's mirror needs, the
// other the state row the first's mirror needs) PostgreSQL aborts one
// transaction whole with a deadlock, SQLSTATE 40P01.
func TestMirrorRacingTransitionsThroughEitherTable(t *testing.T) {
	t.Parallel()
	m := setupMirror(t)
	ctx := context.Background()

	// old: a claim as the previous release writes it; new: a cancel as
	// this release's statements write reminder_state. Each is fenced on the
	// row being pending at fence 0, and marks what it wrote.
	type racer struct {
		name, sql, state string
	}
	old := racer{"old (reminders)", `UPDATE reminders SET state = 'enqueued', fence = fence + 1, claimed_by = 'old',
		claimed_fence = fence + 1, claimed_at = $2, lease_until = $2::timestamptz + interval '1 minute', updated_at = $2
		WHERE id = ANY($1) AND state = 'pending' AND fence = 0`, "enqueued"}
	cur := racer{"new (reminder_state)", `UPDATE reminder_state SET state = 'canceled', fence = fence + 1,
		reason = 'new', finished_at = $2, updated_at = $2
		WHERE id = ANY($1) AND state = 'pending' AND fence = 0`, "canceled"}

	// run is one transaction of a writer, on a connection of its own.
	type run struct {
		w     racer
		tx    pgx.Tx
		pid   uint32
		moved int64
		err   error
	}
	begin := func(t *testing.T, w racer) *run {
		t.Helper()
		tx, err := m.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		// Deadlocks found in 50 ms rather than the server's 1 s.
		_, err = tx.Exec(ctx, `SET LOCAL deadlock_timeout = '50ms'`)
		require.NoError(t, err)
		r := &run{w: w, tx: tx, pid: tx.Conn().PgConn().PID()}
		return r
	}
	exec := func(r *run, ids []int64) {
		tag, err := r.tx.Exec(ctx, r.w.sql, ids, mirrorNow)
		if err == nil {
			r.moved, r.err = tag.RowsAffected(), r.tx.Commit(ctx)
			return
		}
		r.err = err
		_ = r.tx.Rollback(ctx)
	}
	// blocked waits until the backend pid waits for a lock.
	blocked := func(t *testing.T, pid uint32) {
		t.Helper()
		require.Eventually(t, func() bool {
			var n int
			err := m.pool.QueryRow(ctx, `SELECT cardinality(pg_blocking_pids($1))`, int(pid)).Scan(&n)
			return err == nil && n > 0
		}, 10*time.Second, 5*time.Millisecond, "backend %d never waited for a lock", pid)
	}
	async := func(r *run, ids []int64) *sync.WaitGroup {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); exec(r, ids) }()
		return &wg
	}

	for i, c := range []struct {
		name string
		n    int
		// race runs the two transactions over ids; it returns when both
		// have ended.
		race     func(t *testing.T, a, b *run, ids []int64)
		deadlock bool // one of them must end in a deadlock
		winner   *racer
	}{
		{"old commits, then new runs", 3, func(t *testing.T, a, b *run, ids []int64) {
			exec(a, ids)
			exec(b, ids)
		}, false, &old},
		{"new commits, then old runs", 3, func(t *testing.T, a, b *run, ids []int64) {
			exec(b, ids)
			exec(a, ids)
		}, false, &cur},
		{"new waits for old's uncommitted rows", 3, func(t *testing.T, a, b *run, ids []int64) {
			tag, err := a.tx.Exec(ctx, a.w.sql, ids, mirrorNow)
			require.NoError(t, err)
			wg := async(b, ids)
			blocked(t, b.pid)
			require.NoError(t, a.tx.Commit(ctx))
			a.moved = tag.RowsAffected()
			wg.Wait()
		}, false, &old},
		{"old waits for new's uncommitted rows", 3, func(t *testing.T, a, b *run, ids []int64) {
			tag, err := b.tx.Exec(ctx, b.w.sql, ids, mirrorNow)
			require.NoError(t, err)
			wg := async(a, ids)
			blocked(t, a.pid)
			require.NoError(t, b.tx.Commit(ctx))
			b.moved = tag.RowsAffected()
			wg.Wait()
		}, false, &cur},
		{"crossed: old holds a reminders row new's mirror needs, new the state row old's mirror needs", 2,
			func(t *testing.T, a, b *run, ids []int64) {
				// A third transaction holds the second reminders row, so old's
				// statement stops between its two rows: holding the first.
				hold, err := m.pool.Begin(ctx)
				require.NoError(t, err)
				defer hold.Rollback(ctx) //nolint:errcheck // released below
				_, err = hold.Exec(ctx, `SELECT 1 FROM reminders WHERE id = $1 FOR UPDATE`, ids[1])
				require.NoError(t, err)
				wa := async(a, ids)
				blocked(t, a.pid)
				// New locks both state rows, and its mirror waits for old's row.
				wb := async(b, ids)
				blocked(t, b.pid)
				// Old goes on to its mirror, which needs new's state rows.
				require.NoError(t, hold.Rollback(ctx))
				wa.Wait()
				wb.Wait()
			}, true, nil},
		{"both at once over many rows", 400, func(t *testing.T, a, b *run, ids []int64) {
			wa, wb := async(a, ids), async(b, ids)
			wa.Wait()
			wb.Wait()
		}, false, nil},
	} {
		ids := m.schedule(t, pending(fmt.Sprint("race-", i), c.n)...)
		a, b := begin(t, old), begin(t, cur)
		c.race(t, a, b, ids)

		var deadlocks int
		for _, r := range []*run{a, b} {
			var pgErr *pgconn.PgError
			switch {
			case r.err == nil:
			case errors.As(r.err, &pgErr) && pgErr.Code == "40P01":
				deadlocks++
				r.moved = 0 // aborted whole
			default:
				t.Fatalf("%s: %s failed: %v", c.name, r.w.name, r.err)
			}
		}
		require.Less(t, deadlocks, 2, "%s: one of them commits", c.name)
		if c.deadlock {
			require.Equal(t, 1, deadlocks, "%s: the crossed locks deadlock", c.name)
		} else if deadlocks > 0 {
			t.Logf("%s: one transaction ended in a deadlock (40P01)", c.name)
		}

		// Every row moved once, by the writer whose transaction committed.
		rows, err := m.pool.Query(ctx, `SELECT state, count(*) FILTER (WHERE fence = 1), count(*)
			FROM reminder_state WHERE id = ANY($1) GROUP BY state`, ids)
		require.NoError(t, err)
		byState := map[string][2]int64{}
		for rows.Next() {
			var s string
			var fenced, n int64
			require.NoError(t, rows.Scan(&s, &fenced, &n))
			byState[s] = [2]int64{fenced, n}
		}
		require.NoError(t, rows.Err())
		want := map[string][2]int64{}
		for _, r := range []*run{a, b} {
			if r.moved > 0 {
				want[r.w.state] = [2]int64{r.moved, r.moved}
			}
		}
		require.Equal(t, want, byState, "%s: each row moved once (fence 1), by a committed writer, as many as it said", c.name)
		require.EqualValues(t, c.n, a.moved+b.moved, "%s: every row moved", c.name)
		if c.winner != nil {
			require.Equal(t, map[string][2]int64{c.winner.state: {int64(c.n), int64(c.n)}}, byState, c.name)
		}
		require.Empty(t, m.diff(t), "%s: both tables equal", c.name)
	}
}
