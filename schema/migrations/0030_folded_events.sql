-- Nudge schema, version 30: the happy path's events folded into the reminder
-- row (issue 18).
--
-- A delivered reminder wrote three reminder_events rows on its happy path:
-- pending -> enqueued (claimed, by the dispatcher's ClaimDue), enqueued ->
-- sending (attempt_claimed, by the worker's ClaimForDelivery) and sending ->
-- delivered (delivered, by the worker's RecordOutcomes): three heap inserts
-- and six index entries, about a quarter of its WAL (docs/benchmarks.md).
-- Each of those statements rewrites the reminder's row anyway, so what the
-- event said now goes into columns of that row, one slot per event:
--
--   claimed_at, claimed_fence, claimed_by     the claim (pending -> enqueued,
--                                             code claimed, reason "claimed
--                                             for dispatch")
--   started_at, started_fence, started_by     the first attempt (enqueued ->
--                                             sending, code attempt_claimed,
--                                             reason "attempt 1 claimed")
--   delivered_by (with fence, finished_at     the delivery (sending ->
--                 and reason, which the        delivered, code delivered,
--                 terminal row keeps)          reason the row's, else
--                                             "delivered")
--
-- A slot is written once, by the first move of its kind, and never cleared:
-- ClaimDue folds a claim only into an empty claimed slot, ClaimForDelivery
-- only the first attempt (from enqueued, attempts 0, started slot empty),
-- RecordOutcomes only a delivery with code delivered. Every other move (a
-- second claim after a release or a replay, an attempt after a retry or a
-- reclaim, a window deferral, an expiry, a cancel) writes its event as
-- before. So a slot always holds an event that happened, exactly once, and a
-- later move out of enqueued or sending leaves it where it is.
--
-- Why the reminder row and not the attempt row: the attempt row would hold
-- the attempt and delivery for free (worker, fence, started_at, finished_at
-- are there), but attempts are deleted with the payloads (PurgePayloads),
-- long before the events, so the purge would have to turn them into events;
-- the claim has no attempt row at all. On the reminder row there is one slot
-- writer per statement and one place where folded events must become stored
-- ones: DeleteReminders (internal/retention), which appends them to
-- reminder_events before it deletes the row, so they live as long as the
-- events they replace (decision events outlive the rows: BRIEF invariant 12).
-- A terminal delivered row never changes again (no statement moves it; the
-- payload purge changes data, recipient and last_error, none of the slot's).
--
-- One read path: the view reminder_timeline returns the stored events and
-- the folded ones with the columns of reminder_events (id is NULL for a
-- folded one) and seq, the position in the reminder's timeline (1, 2, ...).
-- Every reader orders by seq: fence (a reminder's fence never goes down, and
-- every event carries the fence the row had after it), then the moves that
-- open a fence (a claim, an attempt: both bump it) before the rest, then
-- time, then id. Readers: pkg/intake's Events (nudgectl show, the console,
-- the read API), internal/ops' statistics, bench latency queries, the tests.
-- The view is security_invoker: the caller's grants and row-level security
-- apply, as on the tables (intake sees the events of its own reminders).
--
-- Rolling upgrade. Binaries before this version never read or write the
-- slots: they write all three events as before, and the new statements fold
-- only into empty slots, so the timeline shows every move once whichever
-- version made it (an old dispatcher's stored claim, then a new worker's
-- folded attempt and delivery; a new dispatcher's folded claim, then an old
-- worker's stored attempt and delivery, or an old reconciler's stored
-- republish). What is imprecise while old binaries run: readers of an old
-- version (nudgectl show, the console, stats of version 29 and earlier) read
-- reminder_events alone and miss the folded events of rows new writers
-- moved; roll nudgectl, the console and the reconciler before the dispatcher
-- and workers, and an old retention job must not delete a row with folded
-- events (roll retention first: its windows are days, so that is easy).
--
-- ALTER TABLE ... ADD COLUMN without a default rewrites nothing (a catalog
-- change under a brief exclusive lock).

ALTER TABLE reminders
    ADD COLUMN claimed_at    timestamptz,
    ADD COLUMN claimed_fence bigint,
    ADD COLUMN claimed_by    text,
    ADD COLUMN started_at    timestamptz,
    ADD COLUMN started_fence bigint,
    ADD COLUMN started_by    text,
    ADD COLUMN delivered_by  text;

-- The events one row's slots hold, as reminder_events rows would have held
-- them. stage 0 marks the moves that open a fence (see the view's order).
CREATE FUNCTION nudge_folded_events(
    p_claimed_at timestamptz, p_claimed_fence bigint, p_claimed_by text,
    p_started_at timestamptz, p_started_fence bigint, p_started_by text,
    p_delivered_by text, p_fence bigint, p_finished_at timestamptz, p_reason text)
RETURNS TABLE (from_state text, to_state text, fence bigint, actor text, code text, reason text,
               at timestamptz, stage integer)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 'pending', 'enqueued', p_claimed_fence, p_claimed_by, 'claimed', 'claimed for dispatch', p_claimed_at, 0
     WHERE p_claimed_at IS NOT NULL
    UNION ALL
    SELECT 'enqueued', 'sending', p_started_fence, p_started_by, 'attempt_claimed', 'attempt 1 claimed', p_started_at, 0
     WHERE p_started_at IS NOT NULL
    UNION ALL
    SELECT 'sending', 'delivered', p_fence, p_delivered_by, 'delivered', coalesce(nullif(p_reason, ''), 'delivered'),
           p_finished_at, 1
     WHERE p_delivered_by IS NOT NULL
$$;

-- Every event, stored or folded, with its place in its reminder's timeline.
-- A condition on reminder_id reaches both tables' indexes (the window is
-- partitioned by it, so the planner pushes it down).
CREATE VIEW reminder_timeline WITH (security_invoker = true) AS
SELECT t.id, t.reminder_id, t.from_state, t.to_state, t.fence, t.actor, t.code, t.reason, t.at,
       row_number() OVER (PARTITION BY t.reminder_id
                          ORDER BY t.fence, t.stage, t.at, t.id NULLS LAST)::integer AS seq
  FROM (SELECT e.id, e.reminder_id, e.from_state, e.to_state, e.fence, e.actor, e.code, e.reason, e.at,
               CASE WHEN e.code IN ('claimed', 'attempt_claimed') THEN 0 ELSE 1 END AS stage
          FROM reminder_events e
        UNION ALL
        SELECT NULL::bigint, r.id, f.from_state, f.to_state, f.fence, f.actor, f.code, f.reason, f.at, f.stage
          FROM reminders r
         CROSS JOIN LATERAL nudge_folded_events(r.claimed_at, r.claimed_fence, r.claimed_by, r.started_at,
                                                r.started_fence, r.started_by, r.delivered_by, r.fence,
                                                r.finished_at, r.reason) f
         WHERE r.claimed_at IS NOT NULL OR r.started_at IS NOT NULL OR r.delivered_by IS NOT NULL) t;

-- Writers of the slots read them too (a slot is written only when empty);
-- the reconciler reads timelines (statistics).
GRANT SELECT (claimed_at, claimed_fence, claimed_by, started_at, started_fence, started_by, delivered_by)
    ON reminders TO nudge_dispatcher, nudge_worker, nudge_reconciler;
GRANT UPDATE (claimed_at, claimed_fence, claimed_by) ON reminders TO nudge_dispatcher;
GRANT UPDATE (started_at, started_fence, started_by, delivered_by) ON reminders TO nudge_worker;
-- Readers of timelines. Retention appends a deleted row's folded events.
GRANT SELECT ON reminder_timeline TO nudge_intake, nudge_operator, nudge_reconciler, nudge_retention;
GRANT INSERT (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    ON reminder_events TO nudge_retention;
-- ... and only those: a terminal row's claim, first attempt or delivery
-- (checked against the row, which the deleting statement still sees).
CREATE POLICY nudge_retention_keeps_folded ON reminder_events AS RESTRICTIVE FOR INSERT TO nudge_retention
    WITH CHECK (code IN ('claimed', 'attempt_claimed', 'delivered')
                AND EXISTS (SELECT 1 FROM reminders r
                             WHERE r.id = reminder_id AND r.state IN ('delivered', 'failed', 'expired', 'canceled')));
