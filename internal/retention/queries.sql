-- The statements of a retention pass (internal/retention). Each works in a
-- bounded batch, oldest first, skipping rows another transaction holds, and
-- is idempotent: what it already did no longer matches. Of reminders, only
-- terminal ones are touched: their payload purged (no state changes) or the
-- row deleted (pkg/reminder's transition table: terminal → none, checked by
-- schema/transitions_test.go).
--
-- State lives on reminder_state (schema 32, alias s): the rows are chosen
-- and locked there, over its terminal indexes; the wide reminders row (r)
-- is read and written only for its payload (in the same statement: the
-- mirror of 32 copies only the state columns a statement changed).

-- name: PurgePayloads
-- Empties payloads and deletes the attempts of one batch of terminal rows:
-- on the state row purged_at is set and the recipient masked in last_error,
-- on the wide row data is emptied and the recipient replaced by its mask.
-- FOR UPDATE keeps each row terminal for the statement (a concurrent replay
-- waits, then finds it purged and refuses it); SKIP LOCKED leaves rows
-- another transaction holds for the next pass.
WITH old AS (
    SELECT s.id, s.channel
      FROM reminder_state s
     WHERE s.purged_at IS NULL AND s.state IN ('delivered', 'failed', 'expired', 'canceled')
       AND coalesce(s.finished_at, s.updated_at) < @before
     ORDER BY coalesce(s.finished_at, s.updated_at)
     LIMIT @limit
       FOR UPDATE OF s SKIP LOCKED
), masked AS (
    SELECT old.id, r.recipient,
           CASE WHEN old.channel = 'email'
                THEN left(r.recipient, 1) || '***@' || split_part(r.recipient, '@', 2)
                ELSE left(r.recipient, 3) || '***' || right(r.recipient, 2) END AS masked
      FROM old
      JOIN reminders r ON r.id = old.id
), att AS (
    DELETE FROM delivery_attempts a USING old WHERE a.reminder_id = old.id RETURNING a.id
), upd AS (
    UPDATE reminder_state s
       SET purged_at = @now, last_error = replace(s.last_error, m.recipient, m.masked)
      FROM masked m
     WHERE s.id = m.id
 RETURNING s.id
), wide AS (
    UPDATE reminders r
       SET data = '{}'::jsonb, recipient = m.masked
      FROM masked m
     WHERE r.id = m.id
)
SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM att);

-- name: DeleteReminders
-- Deletes one batch of terminal rows (their attempts
-- cascade; their events stay). The state rows are deleted here, explicitly,
-- beside their wide rows: reminder_state's foreign key (ON DELETE CASCADE)
-- deletes them today too, and finds them gone, but the due-ordered store's
-- slice 4 drops that key (docs/benchmarks.md). The events folded into a row (schema version
-- 30: its claim, first attempt and delivery) are appended to reminder_events
-- first, as they were folded, so the trail outlives the row as before.
--
-- The batch is read as two ordered parts, the purged rows and the unpurged
-- ones (schema 47: reminder_state_terminal_purged and _terminal_unpurged,
-- each terminal row in exactly one of them), each locked as it is read
-- (skipping what another transaction holds) up to a batch, then merged in
-- finish order. Usually every row past this window is purged (the payload
-- window is the shorter) and the unpurged part is empty; it holds rows when
-- the two windows are equal or the purge is behind. A row a part locked
-- beyond the merged batch stays locked, unchanged, until the statement ends
-- (at most a batch more; FOR UPDATE is not allowed over a UNION).
WITH purged AS (
    SELECT s.id, s.claimed_at, s.claimed_fence, s.claimed_by, s.started_at, s.started_fence, s.started_by,
           s.delivered_by, s.fence, s.finished_at, s.reason, coalesce(s.finished_at, s.updated_at) AS done
      FROM reminder_state s
     WHERE s.purged_at IS NOT NULL AND s.state IN ('delivered', 'failed', 'expired', 'canceled')
       AND coalesce(s.finished_at, s.updated_at) < @before
     ORDER BY coalesce(s.finished_at, s.updated_at)
     LIMIT @limit
       FOR UPDATE OF s SKIP LOCKED
), unpurged AS (
    SELECT s.id, s.claimed_at, s.claimed_fence, s.claimed_by, s.started_at, s.started_fence, s.started_by,
           s.delivered_by, s.fence, s.finished_at, s.reason, coalesce(s.finished_at, s.updated_at) AS done
      FROM reminder_state s
     WHERE s.purged_at IS NULL AND s.state IN ('delivered', 'failed', 'expired', 'canceled')
       AND coalesce(s.finished_at, s.updated_at) < @before
     ORDER BY coalesce(s.finished_at, s.updated_at)
     LIMIT @limit
       FOR UPDATE OF s SKIP LOCKED
), old AS (
    SELECT o.* FROM (SELECT * FROM purged UNION ALL SELECT * FROM unpurged) o
     ORDER BY o.done
     LIMIT @limit
), kept AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT old.id, f.from_state, f.to_state, f.fence, f.actor, f.code, f.reason, f.at
      FROM old
     CROSS JOIN LATERAL nudge_folded_events(old.claimed_at, old.claimed_fence, old.claimed_by, old.started_at,
                                            old.started_fence, old.started_by, old.delivered_by, old.fence,
                                            old.finished_at, old.reason) f
), state AS (
    DELETE FROM reminder_state s USING old WHERE s.id = old.id
), del AS (
    DELETE FROM reminders r USING old WHERE r.id = old.id RETURNING r.id
)
SELECT count(*) FROM del;

-- name: EventsRange
-- Reads the id range of the events table (primary key ends).
SELECT coalesce(min(id), 0), coalesce(max(id), 0) FROM reminder_events;

-- name: DeleteEvents
-- Takes the next chunk of up to @limit events from id @lo
-- (ending before id hi, which it returns as the next chunk's start), deletes
-- those older than the window whose reminder is gone, and says whether every
-- event of the chunk is newer than the window: ids grow with time, so that
-- is the sweep's horizon.
WITH bounds AS (
    SELECT coalesce((SELECT id FROM reminder_events WHERE id >= @lo ORDER BY id OFFSET @limit LIMIT 1),
                    @max::bigint + 1) AS hi
), del AS (
    DELETE FROM reminder_events e USING bounds
     WHERE e.id >= @lo AND e.id < bounds.hi AND e.at < @before
       AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = e.reminder_id)
 RETURNING e.id
)
SELECT (SELECT count(*) FROM del), (SELECT hi FROM bounds),
       coalesce((SELECT min(e.at) >= @before FROM reminder_events e, bounds
                  WHERE e.id >= @lo AND e.id < bounds.hi), true);

-- name: DeleteAudit
WITH del AS (
    DELETE FROM operator_audit WHERE id IN (
        SELECT id FROM operator_audit WHERE at < @before ORDER BY at LIMIT @limit)
    RETURNING id
)
SELECT count(*) FROM del;

-- name: DeleteRuns
WITH del AS (
    DELETE FROM dispatch_runs WHERE id IN (
        SELECT id FROM dispatch_runs WHERE finished_at < @before ORDER BY finished_at LIMIT @limit)
    RETURNING id
)
SELECT count(*) FROM del;

-- name: DeleteConfirms
-- Deletes old publish confirmations. One matters only
-- until the dispatch lease of its batch's rows has been resolved, minutes
-- after the confirm; they are kept as long as the runs, as the dispatcher's
-- record of what the broker accepted when.
WITH del AS (
    DELETE FROM publish_confirms WHERE batch IN (
        SELECT batch FROM publish_confirms WHERE confirmed_at < @before ORDER BY confirmed_at LIMIT @limit)
    RETURNING batch
)
SELECT count(*) FROM del;

-- name: DeleteIdleFlows
WITH del AS (
    DELETE FROM rate_flows WHERE (account, flow) IN (
        SELECT account, flow FROM rate_flows
         WHERE last_ask < @before AND tat < @before AND queue_tat < @before AND waiting < @before
         LIMIT @limit)
    RETURNING 1
)
SELECT count(*) FROM del;

-- name: DeleteMessageStatuses
-- Deletes the delivery statuses providers reported (sms_message_status,
-- schema version 24) once they are older than the payload window, as the
-- attempts' provider ids they describe are.
WITH del AS (
    DELETE FROM sms_message_status WHERE message_sid IN (
        SELECT message_sid FROM sms_message_status WHERE reported_at < @before ORDER BY reported_at LIMIT @limit)
    RETURNING 1
)
SELECT count(*) FROM del;
