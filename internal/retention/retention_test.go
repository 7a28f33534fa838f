package retention_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/ops/opstest"
	"github.com/nudgehq/nudge/internal/retention"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

type bundle struct {
	db    *testenv.DB
	conn  *pgx.Conn // the cleaner's own connection, so its statistics can be flushed
	clock *clock.Fake
	c     *retention.Cleaner
	now   time.Time
}

func setup(t *testing.T, cfg retention.Config) *bundle {
	t.Helper()
	return setupOn(t, testenv.Postgres(t), cfg)
}

// setupOn is setup on db: testenv.PostgresBeforeRollout's for a test of
// the state mirror, which runs only until the after-rollout step.
func setupOn(t *testing.T, db *testenv.DB, cfg retention.Config) *bundle {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), db.URL)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	now := time.Now().UTC().Truncate(time.Microsecond)
	clk := clock.NewFake(now)
	return &bundle{db: db, conn: conn, clock: clk, c: retention.New(conn, cfg, clk), now: now}
}

const day = 24 * time.Hour

// seed inserts n terminal reminders that finished ago (alternately email
// and sms, with the recipient in last_error), each with a delivery attempt
// and two events, in one statement. Call it oldest first: ids grow with
// time, as in production.
func (b *bundle) seed(t *testing.T, prefix string, n int, state reminder.State, ago time.Duration) []int64 {
	t.Helper()
	at := b.now.Add(-ago)
	rows, err := b.db.Pool.Query(context.Background(), `
		WITH r AS (
			INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline,
			                       idempotency_key)
			SELECT 'acme', $1 || '-' || i, c.channel, c.recipient, 'course-expiry', '{"course": "Go 101"}',
			       $3::timestamptz - interval '1 hour', $3::timestamptz + interval '1 hour',
			       nudge_idempotency_key('acme', $1 || '-' || i)
			  FROM generate_series(1, $2) AS i,
			       LATERAL (SELECT CASE WHEN i % 2 = 0 THEN 'email' ELSE 'sms' END AS channel,
			                       CASE WHEN i % 2 = 0 THEN 'learner@example.com' ELSE '+14155550100' END AS recipient) c
			 ORDER BY i
			RETURNING id, tenant, channel, recipient, due_at, deadline
		), s AS (
			INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, state, fence, attempts, finished_at,
			                            updated_at, last_error)
			SELECT id, tenant, channel, due_at, deadline, $4, 2, 1, $3, $3, 'mailbox ' || recipient || ' full' FROM r
		), a AS (
			INSERT INTO delivery_attempts (reminder_id, attempt, fence, worker, started_at, finished_at, outcome)
			SELECT id, 1, 2, 'w', $3, $3, 'delivered' FROM r
		), e AS (
			INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, reason, at)
			SELECT id, NULL, 'pending', 0, 'intake', 'scheduled', $3 FROM r
			UNION ALL
			SELECT id, 'sending', $4, 2, 'w', 'done', $3 FROM r
			ORDER BY 1
		)
		SELECT id FROM r ORDER BY id`, prefix, n, at, string(state))
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Len(t, ids, n)
	return ids
}

// snapshot is every row's physical version (ctid, xmin): unchanged means
// untouched, not even rewritten with the same values.
func snapshot(t *testing.T, db *testenv.DB, table string) map[string]string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT id::text, ctid::text || '/' || xmin::text FROM `+table)
	require.NoError(t, err)
	out := map[string]string{}
	var id, v string
	_, err = pgx.ForEachRow(rows, []any{&id, &v}, func() error { out[id] = v; return nil })
	require.NoError(t, err)
	return out
}

type tableStats struct {
	live, dead, updated, deleted int64
	bytes                        int64
}

// stats flushes the cleaner connection's statistics and reads the table's.
func (b *bundle) stats(t *testing.T, table string) tableStats {
	t.Helper()
	ctx := context.Background()
	_, err := b.conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
	require.NoError(t, err)
	var s tableStats
	require.NoError(t, b.conn.QueryRow(ctx, `
		SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_del, pg_total_relation_size(relid)
		  FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, b.db.Schema, table).
		Scan(&s.live, &s.dead, &s.updated, &s.deleted, &s.bytes))
	return s
}

func count(t *testing.T, db *testenv.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// Repeated passes over live work and terminal rows of every age: live rows
// and recent terminal rows are untouched, payloads and attempts go after the
// payload window, reminders after theirs, their events after the longest;
// the second pass writes nothing at all.
func TestPassRemovesOnlyWhatIsDueAndIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t, retention.Config{Batch: 7}) // small batches: many statements per kind
	ctx := context.Background()

	ancient := b.seed(t, "ancient", 20, reminder.Delivered, 200*day) // past every window
	old := b.seed(t, "old", 20, reminder.Failed, 40*day)             // past payload and reminder windows
	mid := b.seed(t, "mid", 20, reminder.Expired, 10*day)            // past the payload window only
	recent := b.seed(t, "recent", 10, reminder.Canceled, 2*day)      // inside every window
	// Open reminders, some created long ago (their old events must stay).
	var live []int64
	for i, st := range []reminder.State{reminder.Pending, reminder.Leased, reminder.Enqueued, reminder.Sending,
		reminder.Retrying, reminder.Quarantined} {
		at := b.now.Add(-300 * day)
		live = append(live, opstest.Insert(t, b.db.Pool, opstest.Row{Key: fmt.Sprintf("live-%d", i), State: st,
			DueAt: b.now.Add(time.Hour), Deadline: b.now.Add(400 * day), Since: at}))
	}
	_, err := b.db.Pool.Exec(ctx, `UPDATE reminder_events SET at = $1 WHERE reminder_id = ANY($2)`, b.now.Add(-300*day), live)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO operator_audit (at, actor, action, reason) VALUES ($1, 'op', 'dlq.drop', 'old'), ($2, 'op', 'dlq.drop', 'new')`,
		b.now.Add(-200*day), b.now.Add(-day))
	require.NoError(t, err)
	liveBefore := snapshot(t, b.db, "reminders")

	sum, err := b.c.Pass(ctx)
	require.NoError(t, err)
	t.Logf("first pass: %+v", sum)
	require.False(t, sum.More)
	require.EqualValues(t, 20, sum.Purged, "mid rows lose their payload (older ones are deleted outright)")
	require.EqualValues(t, 20, sum.AttemptsDeleted)
	require.EqualValues(t, 40, sum.RemindersDeleted, "ancient and old rows are deleted")
	require.EqualValues(t, 40, sum.EventsDeleted, "the ancient rows' events (2 each) are past the event window")
	require.EqualValues(t, 1, sum.AuditDeleted)

	// Live work: not a single row version changed.
	after := snapshot(t, b.db, "reminders")
	for _, id := range append(live, recent...) {
		k := fmt.Sprint(id)
		require.Equal(t, liveBefore[k], after[k], "reminder %d untouched", id)
	}
	require.Equal(t, 6, count(t, b.db, `SELECT count(*) FROM reminder_events WHERE reminder_id = ANY($1)`, live),
		"events of open reminders stay, however old")
	require.Equal(t, 10, count(t, b.db, `SELECT count(*) FROM delivery_attempts WHERE reminder_id = ANY($1)`, recent))
	// Old rows: gone; their events too when past the event window.
	require.Zero(t, count(t, b.db, `SELECT count(*) FROM reminders WHERE id = ANY($1)`, append(ancient, old...)))
	require.Zero(t, count(t, b.db, `SELECT count(*) FROM reminder_events WHERE reminder_id = ANY($1)`, ancient))
	require.Equal(t, 40, count(t, b.db, `SELECT count(*) FROM reminder_events WHERE reminder_id = ANY($1)`, old),
		"decision events outlive their reminders")
	// Mid rows: kept, payload gone, recipient masked everywhere.
	require.Equal(t, 20, count(t, b.db, `SELECT count(*) FROM reminders r JOIN reminder_state s ON s.id = r.id
		WHERE r.id = ANY($1) AND r.data = '{}' AND s.purged_at IS NOT NULL AND s.state = 'expired'
		  AND r.recipient IN ('l***@example.com', '+14***00')
		  AND coalesce(s.last_error, '') NOT LIKE '%learner@example.com%'`, mid))
	require.Zero(t, count(t, b.db, `SELECT count(*) FROM delivery_attempts WHERE reminder_id = ANY($1)`, mid))

	before := map[string]map[string]string{}
	for _, tbl := range []string{"reminders", "reminder_events", "delivery_attempts", "operator_audit"} {
		before[tbl] = snapshot(t, b.db, tbl)
	}
	stats1 := b.stats(t, "reminders")
	sum, err = b.c.Pass(ctx)
	require.NoError(t, err)
	require.Zero(t, sum.Total(), "the second pass finds nothing: %+v", sum)
	stats2 := b.stats(t, "reminders")
	require.Equal(t, stats1.updated, stats2.updated, "no row updated")
	require.Equal(t, stats1.deleted, stats2.deleted, "no row deleted")
	require.Equal(t, stats1.dead, stats2.dead, "no dead tuple created")
	for tbl, snap := range before {
		require.Equal(t, snap, snapshot(t, b.db, tbl), "%s untouched by the second pass", tbl)
	}
}

// Cycles of terminal work aging out, each followed by a pass and the VACUUM
// autovacuum would run: the table stops growing (space is reused), its live
// rows are only what the windows keep, and a pass leaves as many dead tuples
// as rows it changed, which the vacuum reclaims.
func TestPassesDoNotBloat(t *testing.T) {
	t.Parallel()
	b := setup(t, retention.Config{Batch: 100})
	ctx := context.Background()
	live := opstest.Insert(t, b.db.Pool, opstest.Row{Key: "live", DueAt: b.now.Add(time.Hour), Deadline: b.now.Add(400 * day)})

	var sizes []int64
	for cycle := range 4 {
		b.seed(t, fmt.Sprintf("c%d", cycle), 300, reminder.Delivered, 40*day)
		before := b.stats(t, "reminders")
		sum, err := b.c.Pass(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 300, sum.RemindersDeleted)
		after := b.stats(t, "reminders")
		// One dead tuple per row removed: rows past both windows are deleted
		// without being purged (rewritten) first.
		require.EqualValues(t, 300, after.deleted-before.deleted)
		require.Zero(t, after.updated-before.updated)
		// VACUUM, as autovacuum would; tests running in parallel in other
		// schemas can briefly hold back what it may remove, so retry.
		var vac tableStats
		require.Eventually(t, func() bool {
			_, err = b.db.Pool.Exec(ctx, `VACUUM reminders, delivery_attempts, reminder_events`)
			require.NoError(t, err)
			vac = b.stats(t, "reminders")
			return vac.dead == 0
		}, 30*time.Second, 200*time.Millisecond, "vacuum reclaims every dead tuple")
		t.Logf("cycle %d: reminders %d bytes, live %d, dead %d after vacuum (pass: %+v)", cycle, vac.bytes, vac.live, vac.dead, sum)
		sizes = append(sizes, vac.bytes)
	}
	require.LessOrEqual(t, sizes[3], sizes[1], "the table stops growing once freed space is reused: %v", sizes)
	require.Equal(t, 1, count(t, b.db, `SELECT count(*) FROM reminders`))
	s, _, _ := opstest.State(t, b.db.Pool, live)
	require.Equal(t, reminder.Pending, s)
}

// A pass is bounded: past MaxBatches statements of a kind it stops, says
// there is more, and the next pass continues where the work is.
func TestPassIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, retention.Config{Batch: 5, MaxBatches: 2})
	ctx := context.Background()
	b.seed(t, "old", 23, reminder.Delivered, 200*day)

	var total retention.Summary
	for pass := 0; ; pass++ {
		require.Less(t, pass, 20)
		sum, err := b.c.Pass(ctx)
		require.NoError(t, err)
		require.LessOrEqual(t, sum.RemindersDeleted, int64(10), "at most MaxBatches × Batch per pass")
		require.LessOrEqual(t, sum.EventsDeleted, int64(10))
		total.RemindersDeleted += sum.RemindersDeleted
		total.EventsDeleted += sum.EventsDeleted
		if sum.Total() == 0 {
			break
		}
	}
	require.EqualValues(t, 23, total.RemindersDeleted)
	require.EqualValues(t, 23*2, total.EventsDeleted)
	require.Zero(t, count(t, b.db, `SELECT count(*) FROM reminders`))
	require.Zero(t, count(t, b.db, `SELECT count(*) FROM reminder_events`))
}

// Rate-limit flows idle for a day go; a flow that asked recently, or whose
// pacing or deferred turns reach into the last day, stays. Old publish
// confirmations go with the dispatch runs.
func TestIdleFlowsAndOldConfirmationsAreDeleted(t *testing.T) {
	t.Parallel()
	b := setup(t, retention.Config{})
	ctx := context.Background()
	old := b.now.Add(-retention.IdleFlowAfter - time.Minute)
	recent := b.now.Add(-time.Hour)
	for _, f := range []struct {
		flow                          string
		lastAsk, tat, queueTat, waits time.Time
	}{
		{"sms:idle", old, old, old, old},
		{"sms:asked-lately", recent, old, old, old},
		{"sms:turn-pending", old, old, old, b.now.Add(time.Hour)},
		{"sms:paced-ahead", old, old, recent, old},
	} {
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO rate_flows (account, flow, cap, tat, queue_tat, waiting, last_ask, share)
			VALUES ('sms', $1, NULL, $2, $3, $4, $5, 10)`, f.flow, f.tat, f.queueTat, f.waits, f.lastAsk)
		require.NoError(t, err)
	}
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO publish_confirms (batch, confirmed_at, actor, confirmed)
		VALUES (1, $1, 'd', 500), (2, $2, 'd', 500)`, b.now.Add(-40*day), b.now.Add(-day))
	require.NoError(t, err)

	sum, err := b.c.Pass(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, sum.FlowsDeleted)
	require.EqualValues(t, 1, sum.ConfirmsDeleted)
	rows, err := b.db.Pool.Query(ctx, `SELECT flow FROM rate_flows ORDER BY flow`)
	require.NoError(t, err)
	flows, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"sms:asked-lately", "sms:paced-ahead", "sms:turn-pending"}, flows)
	require.Equal(t, 1, count(t, b.db, `SELECT count(*) FROM publish_confirms WHERE batch = 2`))

	sum, err = b.c.Pass(ctx)
	require.NoError(t, err)
	require.Zero(t, sum.Total())
}

// A purged reminder cannot be replayed.
func TestPurgedReminderIsNotReplayable(t *testing.T) {
	t.Parallel()
	b := setup(t, retention.Config{})
	ids := b.seed(t, "failed", 1, reminder.Failed, 10*day)
	_, err := b.c.Pass(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, count(t, b.db, `SELECT count(*) FROM reminder_state WHERE id = $1 AND purged_at IS NOT NULL`, ids[0]))
}

func TestConfig(t *testing.T) {
	t.Parallel()
	c := retention.Config{}.WithDefaults()
	require.Equal(t, retention.DefaultPayloadAfter, c.PayloadAfter)
	require.Equal(t, retention.DefaultReminderAfter, c.ReminderAfter)
	require.Equal(t, retention.DefaultEventAfter, c.EventAfter)
	require.NoError(t, c.Validate())
	for _, tc := range []struct {
		cfg  retention.Config
		want string
	}{
		{retention.Config{PayloadAfter: 40 * day}, "--retain-reminders 720h0m0s is shorter than --retain-payload"},
		{retention.Config{EventAfter: 10 * day}, "decision events must outlive the reminders"},
		{retention.Config{PayloadAfter: time.Minute}, "--retain-payload 1m0s: must be at least 1h"},
	} {
		require.ErrorContains(t, tc.cfg.Validate(), tc.want)
	}
}

// A reminder delivered on the happy path holds its claim, first attempt and
// delivery folded into its row (schema version 30). Deleting the row keeps
// them as events, the same timeline, in the same order, until the events'
// own window has passed.
func TestFoldedEventsOutliveTheirReminder(t *testing.T) {
	t.Parallel()
	b := setup(t, retention.Config{})
	ctx := context.Background()
	ids := b.seed(t, "folded", 3, reminder.Delivered, 40*day) // past the reminder window
	_, err := b.db.Pool.Exec(ctx, `DELETE FROM reminder_events WHERE reminder_id = ANY($1) AND to_state = 'delivered'`, ids)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE reminder_state SET claimed_at = finished_at - interval '2 seconds', claimed_fence = 1,
		claimed_by = 'd', started_at = finished_at - interval '1 second', started_fence = 2, started_by = 'w',
		delivered_by = 'w', reason = NULL WHERE id = ANY($1)`, ids)
	require.NoError(t, err)
	before := map[int64][]opstest.Event{}
	for _, id := range ids {
		before[id] = opstest.Events(t, b.db.Pool, id)
		require.Len(t, before[id], 4, "scheduled, then the three folded ones")
	}

	sum, err := b.c.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), sum.RemindersDeleted)
	for _, id := range ids {
		require.Equal(t, before[id], opstest.Events(t, b.db.Pool, id), "reminder %d's timeline outlives it", id)
	}
	require.Equal(t, 12, count(t, b.db, `SELECT count(*) FROM reminder_events WHERE reminder_id = ANY($1)`, ids))

	// A second pass keeps them once (the rows are gone: nothing to fold).
	_, err = b.c.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, 12, count(t, b.db, `SELECT count(*) FROM reminder_events WHERE reminder_id = ANY($1)`, ids))

	// Past the events' window they go with the others.
	b.clock.Advance(200 * day)
	_, err = b.c.Pass(ctx)
	require.NoError(t, err)
	require.Zero(t, count(t, b.db, `SELECT count(*) FROM reminder_events WHERE reminder_id = ANY($1)`, ids))
}

// A purge writes the state row (purged_at, the masked last error) and the
// wide row (data, recipient) in one transaction, and the two copies of the
// state that this release keeps (reminders and reminder_state, schema 32)
// agree afterwards: a purge that wrote both tables in one statement would
// have its state row put back by the mirror, and be purged again forever.
// Run before the after-rollout step: after it there is one copy.
func TestPurgeLeavesBothCopiesOfTheStateEqual(t *testing.T) {
	t.Parallel()
	b := setupOn(t, testenv.PostgresBeforeRollout(t), retention.Config{})
	ids := b.seed(t, "old", 6, reminder.Delivered, 8*day)

	sum, err := b.c.Pass(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 6, sum.Purged)
	require.EqualValues(t, 6, sum.AttemptsDeleted)

	require.Equal(t, 6, count(t, b.db, `
		SELECT count(*) FROM reminders r JOIN reminder_state s ON s.id = r.id
		 WHERE r.id = ANY($1) AND r.data = '{}' AND r.recipient IN ('l***@example.com', '+14***00')
		   AND s.purged_at IS NOT NULL AND s.purged_at = r.purged_at
		   AND s.last_error = r.last_error AND s.last_error NOT LIKE '%learner@%' AND s.last_error NOT LIKE '%+14155550100%'`,
		ids))

	sum, err = b.c.Pass(context.Background())
	require.NoError(t, err)
	require.Zero(t, sum.Purged, "purged once")
}

// Retention deletes the state rows of the reminders it deletes itself, not
// through reminder_state's foreign key, which the due-ordered store's
// slice 4 drops: with the key dropped, no state row is left without its
// reminder, and the ones not due for deletion stay.
func TestDeletedRemindersTakeTheirStateRowsWithoutTheForeignKey(t *testing.T) {
	t.Parallel()
	b := setup(t, retention.Config{})
	_, err := b.db.Pool.Exec(context.Background(), `ALTER TABLE reminder_state DROP CONSTRAINT IF EXISTS reminder_state_id_fkey`)
	require.NoError(t, err)
	b.seed(t, "old", 5, reminder.Delivered, 40*day)
	b.seed(t, "recent", 3, reminder.Delivered, day)
	sum, err := b.c.Pass(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 5, sum.RemindersDeleted)
	require.Zero(t, count(t, b.db, `SELECT count(*) FROM reminder_state s
		WHERE NOT EXISTS (SELECT 1 FROM reminders r WHERE r.id = s.id)`), "orphan state rows")
	require.Equal(t, 3, count(t, b.db, `SELECT count(*) FROM reminder_state`))
}
