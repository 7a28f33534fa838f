-- The statements of a retention pass (internal/retention). Each works in a
-- bounded batch, oldest first, skipping rows another transaction holds, and
-- is idempotent: what it already did no longer matches. Of reminders, only
-- terminal ones are touched: their payload purged (no state changes) or the
-- row deleted (pkg/reminder's transition table: terminal → none, checked by
-- schema/transitions_test.go).

-- name: PurgePayloads
-- Empties payloads and deletes the attempts of one batch of
-- terminal rows. FOR UPDATE keeps each row terminal for the statement (a
-- concurrent replay waits, then finds it purged and refuses it); SKIP LOCKED
-- leaves rows another transaction holds for the next pass.
WITH old AS (
    SELECT id, recipient,
           CASE WHEN channel = 'email'
                THEN left(recipient, 1) || '***@' || split_part(recipient, '@', 2)
                ELSE left(recipient, 3) || '***' || right(recipient, 2) END AS masked
      FROM reminders
     WHERE purged_at IS NULL AND state IN ('delivered', 'failed', 'expired', 'canceled')
       AND coalesce(finished_at, updated_at) < @before
     ORDER BY coalesce(finished_at, updated_at)
     LIMIT @limit
       FOR UPDATE SKIP LOCKED
), att AS (
    DELETE FROM delivery_attempts a USING old WHERE a.reminder_id = old.id RETURNING a.id
), upd AS (
    UPDATE reminders r
       SET data = '{}'::jsonb, purged_at = @now, recipient = old.masked,
           last_error = replace(r.last_error, old.recipient, old.masked)
      FROM old
     WHERE r.id = old.id
 RETURNING r.id
)
SELECT (SELECT count(*) FROM upd), (SELECT count(*) FROM att);

-- name: DeleteReminders
-- Deletes one batch of terminal rows (their attempts
-- cascade; their events stay). The events folded into a row (schema version
-- 30: its claim, first attempt and delivery) are appended to reminder_events
-- first, as they were folded, so the trail outlives the row as before.
WITH old AS (
    SELECT id FROM reminders
     WHERE state IN ('delivered', 'failed', 'expired', 'canceled') AND coalesce(finished_at, updated_at) < @before
     ORDER BY coalesce(finished_at, updated_at)
     LIMIT @limit
       FOR UPDATE SKIP LOCKED
), kept AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT r.id, f.from_state, f.to_state, f.fence, f.actor, f.code, f.reason, f.at
      FROM reminders r
      JOIN old ON old.id = r.id
     CROSS JOIN LATERAL nudge_folded_events(r.claimed_at, r.claimed_fence, r.claimed_by, r.started_at,
                                            r.started_fence, r.started_by, r.delivered_by, r.fence,
                                            r.finished_at, r.reason) f
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
       AND NOT EXISTS (SELECT 1 FROM reminders r WHERE r.id = e.reminder_id)
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
