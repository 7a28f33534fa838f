-- The statements schema.Migrate runs besides the migrations: the backfills it
-- runs outside a migration's transaction, before the migration that checks
-- them (see preSteps in schema.go), and what a migration's timed-out lock
-- wait was behind (apply.go).

-- name: BackfillState
-- Copies the state columns of up to @size reminders with ids above @after
-- that have no reminder_state row (rows that predate migration 0032; the
-- forward trigger copies every later one), and returns the last id looked
-- at, NULL when none was left. ON CONFLICT: a row the trigger copied first
-- keeps that newer copy.
--
-- The rows copied are locked (FOR SHARE OF r) and read as locked: the
-- previous release's fleet keeps writing reminders meanwhile, and the
-- forward trigger of a write to a row without its state row has nothing to
-- update. Unlocked, a write committed while the batch ran was lost: the
-- batch copied the row as its snapshot saw it, before the write
-- (schema/state_mirror_test.go, TestMirrorBackfillRacingAWriteOfTheOldRelease).
-- Locked, the batch waits for a write in flight and copies the row as
-- written, and a later write waits for the batch, then finds the state row
-- and its trigger updates it. The lock costs one tuple lock per copied row,
-- once (docs/deploy.md); rows that have their state row are not locked.
WITH batch AS (
    SELECT id FROM reminders WHERE id > @after ORDER BY id LIMIT @size
), missing AS (
    SELECT r.id, r.tenant, r.channel, r.state, r.fence, r.due_at, r.deadline, r.lease_until, r.attempts,
           r.republishes, r.next_attempt_at, r.enqueued_at, r.dispatch_batch, r.updated_at, r.finished_at,
           r.purged_at, r.requested_due_at, r.claimed_at, r.claimed_fence, r.claimed_by, r.started_at,
           r.started_fence, r.started_by, r.delivered_by, r.reason, r.last_error, r.tz, r.window_open,
           r.window_close, r.window_days
      FROM reminders r JOIN batch USING (id)
     WHERE NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)
     ORDER BY r.id
       FOR SHARE OF r
), copied AS (
    INSERT INTO reminder_state (id, tenant, channel, state, fence, due_at, deadline, lease_until, attempts,
                                republishes, next_attempt_at, enqueued_at, dispatch_batch, updated_at, finished_at,
                                purged_at, requested_due_at, claimed_at, claimed_fence, claimed_by, started_at,
                                started_fence, started_by, delivered_by, reason, last_error, tz, window_open,
                                window_close, window_days)
    SELECT id, tenant, channel, state, fence, due_at, deadline, lease_until, attempts,
           republishes, next_attempt_at, enqueued_at, dispatch_batch, updated_at, finished_at,
           purged_at, requested_due_at, claimed_at, claimed_fence, claimed_by, started_at,
           started_fence, started_by, delivered_by, reason, last_error, tz, window_open,
           window_close, window_days
      FROM missing
     ORDER BY id
    ON CONFLICT (id) DO NOTHING
)
SELECT max(id) FROM batch;


-- name: LockHolders
-- The sessions other than this one whose transactions, open for longer than
-- @older, hold a lock on a table of the current schema: what a migration's
-- lock request that timed out after @older was waiting behind (an ACCESS
-- EXCLUSIVE request conflicts with every lock, ROW EXCLUSIVE and ACCESS
-- SHARE included). Oldest transaction first. xact_start and state are NULL
-- for another login's sessions unless this one may read them
-- (pg_read_all_stats): such a session is listed with no age.
SELECT a.pid,
       string_agg(DISTINCT c.relname::text, ', ' ORDER BY c.relname::text) AS tables,
       coalesce(a.state, '') AS state,
       coalesce(extract(epoch FROM now() - a.xact_start), -1)::float8 AS open_seconds
  FROM pg_locks l
  JOIN pg_class c ON c.oid = l.relation
  JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'relation' AND l.granted
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
   AND l.pid <> pg_backend_pid()
   AND (a.xact_start IS NULL OR a.xact_start < now() - @older::interval)
 GROUP BY a.pid, a.state, a.xact_start
 ORDER BY a.xact_start NULLS LAST, a.pid
 LIMIT 5
