-- Schema version 34: the SQL functions and the timeline view read and write
-- reminder_state (issue 18, layout A, release 1: "The plan for A" in
-- docs/benchmarks.md).
--
-- Every function of the migrations that reads or writes a state column of
-- reminders is replaced here with the same signature, volatility, security
-- and grants (CREATE OR REPLACE keeps the grants; SECURITY DEFINER and the
-- pinned search_path are restated, as CREATE OR REPLACE resets both), the
-- same answers, fences, state checks and events. What changes in each:
--
-- - The state columns (state, fence, times, leases, slots, reason, tz,
--   window) are read from and written to reminder_state (alias s). The wide
--   row (alias r) is joined by primary key for what only it holds: key,
--   recipient, template, data. It is found by its key, (tenant, key), which
--   stays on it (reminders_logical_key).
-- - A row is locked as reminder_state's (FOR UPDATE OF s), never as
--   reminders': this release locks the state row first, then the mirror of
--   migration 32 copies the change to reminders in the same transaction.
--   nudge_update writes the content (recipient, template, data) to the wide
--   row after it has locked and written the state row.
-- - The zone and window are state columns (the dispatcher's claim reads
--   them from s), so nudge_reschedule_window writes them to s only; until
--   the after-rollout step (35) drops the mirror, it keeps reminders' copies
--   equal, and reminders' checks of zone and window (reminders_tz_name,
--   reminders_window) vet what it writes; 35 puts the same checks on s.
-- - Intake (nudge_try_schedule_unchecked, under nudge_schedule and
--   nudge_try_schedule) inserts the wide row as before (its NOT NULL due_at
--   and deadline, and the zone and window, must be given while reminders
--   has them) and then the state row itself, ON CONFLICT DO NOTHING: this
--   release's forward trigger has inserted an equal one already, the next
--   release has no trigger. While both run, that costs a call of
--   nudge_schedule ~0.1 ms of backend CPU more (BenchmarkScheduleFunctionVsBulk,
--   N=4000, 3 runs interleaved with version 33's, load ~5: 0.83-0.93 ->
--   0.98-1.17 CPU-s per 1,000 as an intake login). The next release must
--   replace this function again: its insert names due_at, deadline, zone
--   and window of the wide row.
--
-- Functions the plan listed that read no state column, left as they are:
-- nudge_schedule and nudge_try_schedule (they call
-- nudge_try_schedule_unchecked), nudge_tenant_allowed and
-- nudge_campaign_create (they ask whether the session may INSERT into
-- reminders, a privilege, which intake still needs for the wide row),
-- nudge_rate_reserve and nudge_campaign_admission_text (the word reminders
-- appears in a comment and a message only).
--
-- Key prefixes. nudge_cancel_prefix found the waiting rows of a prefix over
-- reminders_waiting_keys, and nudge_campaign_status counted a campaign's
-- rows by state index-only over reminders_campaign_keys: both indexes name
-- reminders' state (in the predicate, in INCLUDE) and go when the next
-- release drops it. reminders_keys, the plain index of keys by prefix
-- (text_pattern_ops, so a LIKE prefix uses it under any collation) that
-- layout A keeps on the wide row, serves both; its entries point at wide
-- rows, whose state is then read from reminder_state by primary key (one
-- probe per key under the prefix, terminal ones included, where the partial
-- index held the open ones only). Building it reads the whole table under a
-- lock that holds writes back (seconds per million rows): a large install
-- builds it first with CREATE INDEX CONCURRENTLY and the same definition,
-- which IF NOT EXISTS then keeps. It costs the rollout WAL: until the
-- after-rollout step (35) drops the mirror, every transition rewrites the wide row too,
-- never HOT (state changes, which reminders' partial indexes name), so each
-- enters this index as it enters reminders_logical_key (same columns: by
-- that index's share in docs/benchmarks.md, ~3 records and ~250 B more per
-- delivered reminder, estimated, not measured). After 35 a transition
-- writes no wide row, and intake pays one entry per reminder.
--
-- Rolling upgrade: the functions live in the database, so every release's
-- binaries call these from now on; their answers and what they leave in
-- reminders (through the mirror) are those of version 33. A cancel or
-- reschedule locks the state row and then the wide one; a claimer of the
-- previous release locks them in the other order: if the two meet on the
-- same row PostgreSQL aborts one (40P01), which is run again.

CREATE INDEX IF NOT EXISTS reminders_keys ON reminders (tenant, key text_pattern_ops);

-- Intake's body (version 13's), the state row written by itself.
CREATE OR REPLACE FUNCTION nudge_try_schedule_unchecked(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz,
    p_actor text DEFAULT 'intake',
    p_tz text DEFAULT NULL, p_due_local timestamp DEFAULT NULL, p_deadline_local timestamp DEFAULT NULL,
    p_window_open time DEFAULT NULL, p_window_close time DEFAULT NULL, p_window_days integer DEFAULT NULL,
    OUT id bigint, OUT status text, OUT field text, OUT reason text)
LANGUAGE plpgsql AS $$
DECLARE
    invalid text[];
    cur     record;
    due     timestamptz;
    dl      timestamptz;
    w       record;
BEGIN
    invalid := nudge_invalid_local(p_tz, p_due_at, p_due_local, p_deadline, p_deadline_local,
                                   p_window_open, p_window_close, p_window_days);
    IF invalid IS NULL THEN
        due := coalesce(p_due_at, nudge_resolve_local(p_due_local, p_tz));
        dl := coalesce(p_deadline, nudge_resolve_local(p_deadline_local, p_tz));
        invalid := nudge_invalid(p_tenant, p_key, p_channel, p_recipient, p_template, p_data, due, dl);
    END IF;
    IF invalid IS NOT NULL THEN
        status := 'invalid'; field := invalid[1]; reason := invalid[2];
        RETURN;
    END IF;
    w := nudge_window_stored(p_window_open, p_window_close, p_window_days);

    INSERT INTO reminders AS t (tenant, key, channel, recipient, template, data, due_at, deadline,
                                idempotency_key, tz, window_open, window_close, window_days)
    VALUES (p_tenant, p_key, p_channel, p_recipient, p_template, COALESCE(p_data, '{}'::jsonb),
            due, dl, nudge_idempotency_key(p_tenant, p_key), p_tz, w.window_open, w.window_close, w.window_days)
    ON CONFLICT ON CONSTRAINT reminders_logical_key DO NOTHING
    RETURNING t.id INTO id;

    IF id IS NOT NULL THEN
        -- (The constraint by name: "id" is also this function's OUT parameter.)
        INSERT INTO reminder_state AS s (id, tenant, channel, due_at, deadline, tz, window_open, window_close,
                                         window_days)
        VALUES (id, p_tenant, p_channel, due, dl, p_tz, w.window_open, w.window_close, w.window_days)
        ON CONFLICT ON CONSTRAINT reminder_state_pkey DO NOTHING;
        INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
        VALUES (id, NULL, 'pending', 0, p_actor, 'scheduled', 'scheduled', now());
        status := 'created';
        RETURN;
    END IF;

    SELECT r.id, s.channel, r.recipient, r.template, r.data, s.requested_due_at, s.due_at, s.deadline, s.tz,
           s.window_open, s.window_close, s.window_days
      INTO cur
      FROM reminders r JOIN reminder_state s ON s.id = r.id
     WHERE r.tenant = p_tenant AND r.key = p_key;
    id := cur.id;
    IF cur.channel = p_channel AND cur.recipient = p_recipient AND cur.template = p_template
       AND cur.data = COALESCE(p_data, '{}'::jsonb)
       AND coalesce(cur.requested_due_at, cur.due_at) = due AND cur.deadline = dl
       AND coalesce(cur.tz, 'UTC') = coalesce(p_tz, 'UTC')
       AND (cur.window_open, cur.window_close, cur.window_days)
           IS NOT DISTINCT FROM (w.window_open, w.window_close, w.window_days) THEN
        status := 'exists';
    ELSE
        status := 'conflict'; field := 'key';
        reason := format('key %L of tenant %L is already scheduled with different content', p_key, p_tenant);
    END IF;
END $$;

-- Version 9's body, under nudge_cancel.
CREATE OR REPLACE FUNCTION nudge_cancel_unchecked(p_tenant text, p_key text, p_actor text DEFAULT 'intake',
                                                  p_reason text DEFAULT 'canceled by application')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    cur record;
BEGIN
    SELECT s.id, s.state, s.fence INTO cur
      FROM reminders r JOIN reminder_state s ON s.id = r.id
     WHERE r.tenant = p_tenant AND r.key = p_key
       FOR UPDATE OF s;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF cur.state IN ('delivered', 'failed', 'expired', 'canceled', 'sending') THEN
        RETURN cur.state;
    END IF;
    UPDATE reminder_state s
       SET state = 'canceled', fence = s.fence + 1, lease_until = NULL, reason = p_reason,
           updated_at = now(), finished_at = now()
     WHERE s.id = cur.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    VALUES (cur.id, cur.state, 'canceled', cur.fence + 1, p_actor, 'canceled', p_reason, now());
    RETURN 'canceled';
END $$;

-- Version 13's body, under nudge_reschedule.
CREATE OR REPLACE FUNCTION nudge_reschedule_unchecked(p_tenant text, p_key text, p_due_at timestamptz,
                                                      p_deadline timestamptz, p_actor text DEFAULT 'intake',
                                                      p_reason text DEFAULT 'rescheduled by application')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    cur     record;
    invalid text[];
BEGIN
    SELECT s.id, s.tenant, r.key, s.channel, r.recipient, r.template, r.data, s.state, s.fence INTO cur
      FROM reminders r JOIN reminder_state s ON s.id = r.id
     WHERE r.tenant = p_tenant AND r.key = p_key
       FOR UPDATE OF s;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    invalid := nudge_invalid(cur.tenant, cur.key, cur.channel, cur.recipient, cur.template, cur.data,
                             p_due_at, p_deadline);
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'nudge: field "%" %', invalid[1], invalid[2] USING ERRCODE = '22023', COLUMN = invalid[1];
    END IF;
    IF cur.state IN ('delivered', 'failed', 'expired', 'canceled', 'sending') THEN
        RETURN cur.state;
    END IF;
    UPDATE reminder_state s
       SET state = 'pending', fence = s.fence + 1, lease_until = NULL, next_attempt_at = NULL,
           due_at = p_due_at, requested_due_at = NULL, deadline = p_deadline, reason = NULL, updated_at = now()
     WHERE s.id = cur.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    VALUES (cur.id, cur.state, 'pending', cur.fence + 1, p_actor, 'rescheduled', p_reason, now());
    RETURN 'pending';
END $$;

-- Version 22's: new times and window, answered as a nudge_change row.
CREATE OR REPLACE FUNCTION nudge_reschedule_window(p_tenant text, p_key text, p_due_at timestamptz,
                                                   p_deadline timestamptz, p_window_open time, p_window_close time,
                                                   p_window_days integer, p_actor text DEFAULT 'intake',
                                                   p_reason text DEFAULT 'rescheduled by application')
RETURNS nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    cur     record;
    w       record;
    invalid text[];
    refused text;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    SELECT s.id, s.tenant, r.key, s.channel, r.recipient, r.template, r.data, s.state, s.fence,
           s.requested_due_at, s.due_at, s.deadline, s.window_open, s.window_close, s.window_days INTO cur
      FROM reminders r JOIN reminder_state s ON s.id = r.id
     WHERE r.tenant = p_tenant AND r.key = p_key
       FOR UPDATE OF s;
    IF NOT FOUND THEN
        RETURN ROW(NULL, p_key, 'not_found', NULL)::nudge_change;
    END IF;
    invalid := coalesce(
        nudge_invalid_local(NULL, p_due_at, NULL, p_deadline, NULL, p_window_open, p_window_close, p_window_days),
        nudge_invalid(cur.tenant, cur.key, cur.channel, cur.recipient, cur.template, cur.data, p_due_at, p_deadline));
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'nudge: field "%" %', invalid[1], invalid[2] USING ERRCODE = '22023', COLUMN = invalid[1];
    END IF;
    refused := nudge_change_refused(cur.state);
    IF refused IS NOT NULL THEN
        RETURN ROW(cur.id, cur.key, refused, cur.state)::nudge_change;
    END IF;
    SELECT * INTO w FROM nudge_window_stored(p_window_open, p_window_close, p_window_days);
    IF coalesce(cur.requested_due_at, cur.due_at) = p_due_at AND cur.deadline = p_deadline
       AND cur.window_open IS NOT DISTINCT FROM w.window_open
       AND cur.window_close IS NOT DISTINCT FROM w.window_close
       AND cur.window_days IS NOT DISTINCT FROM w.window_days THEN
        RETURN ROW(cur.id, cur.key, 'unchanged', cur.state)::nudge_change;
    END IF;
    UPDATE reminder_state s
       SET state = 'pending', fence = s.fence + 1, lease_until = NULL, next_attempt_at = NULL,
           due_at = p_due_at, requested_due_at = NULL, deadline = p_deadline,
           window_open = w.window_open, window_close = w.window_close, window_days = w.window_days,
           reason = NULL, updated_at = now()
     WHERE s.id = cur.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    VALUES (cur.id, cur.state, 'pending', cur.fence + 1, p_actor, 'rescheduled', p_reason, now());
    RETURN ROW(cur.id, cur.key, 'changed', 'pending')::nudge_change;
END $$;

-- Version 22's: nudge_reschedule_window with the window the reminder has.
CREATE OR REPLACE FUNCTION nudge_reschedule_to(p_tenant text, p_key text, p_due_at timestamptz, p_deadline timestamptz,
                                               p_actor text DEFAULT 'intake',
                                               p_reason text DEFAULT 'rescheduled by application')
RETURNS nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    w record;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    SELECT s.window_open, s.window_close, s.window_days INTO w
      FROM reminders r JOIN reminder_state s ON s.id = r.id
     WHERE r.tenant = p_tenant AND r.key = p_key;
    RETURN nudge_reschedule_window(p_tenant, p_key, p_due_at, p_deadline,
                                   w.window_open, w.window_close, w.window_days, p_actor, p_reason);
END $$;

-- Version 14's: new content. The state row is locked and moved first, then
-- the wide row takes the content.
CREATE OR REPLACE FUNCTION nudge_update(p_tenant text, p_key text, p_recipient text, p_template text, p_data jsonb,
                                        p_actor text DEFAULT 'intake', p_reason text DEFAULT 'updated by application')
RETURNS nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    cur     record;
    invalid text[];
    refused text;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    SELECT s.id, s.tenant, r.key, s.channel, r.recipient, r.template, r.data, s.state, s.fence, s.due_at,
           s.deadline INTO cur
      FROM reminders r JOIN reminder_state s ON s.id = r.id
     WHERE r.tenant = p_tenant AND r.key = p_key
       FOR UPDATE OF s;
    IF NOT FOUND THEN
        RETURN ROW(NULL, p_key, 'not_found', NULL)::nudge_change;
    END IF;
    p_recipient := coalesce(p_recipient, cur.recipient);
    p_template := coalesce(p_template, cur.template);
    p_data := coalesce(p_data, cur.data);
    invalid := nudge_invalid(cur.tenant, cur.key, cur.channel, p_recipient, p_template, p_data, cur.due_at,
                             cur.deadline);
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'nudge: field "%" %', invalid[1], invalid[2] USING ERRCODE = '22023', COLUMN = invalid[1];
    END IF;
    refused := nudge_change_refused(cur.state);
    IF refused IS NOT NULL THEN
        RETURN ROW(cur.id, cur.key, refused, cur.state)::nudge_change;
    END IF;
    IF cur.recipient = p_recipient AND cur.template = p_template AND cur.data = p_data THEN
        RETURN ROW(cur.id, cur.key, 'unchanged', cur.state)::nudge_change;
    END IF;
    UPDATE reminder_state s
       SET state = 'pending', fence = s.fence + 1, lease_until = NULL, next_attempt_at = NULL,
           reason = NULL, updated_at = now()
     WHERE s.id = cur.id;
    UPDATE reminders r
       SET recipient = p_recipient, template = p_template, data = p_data
     WHERE r.id = cur.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    VALUES (cur.id, cur.state, 'pending', cur.fence + 1, p_actor, 'updated', p_reason, now());
    RETURN ROW(cur.id, cur.key, 'changed', 'pending')::nudge_change;
END $$;

-- Version 27's answers, the rows found in one pass: every key under the
-- prefix (reminders_keys, which holds the wide rows of every state), each
-- one's state by primary key, the open ones kept, oldest first. Version 27
-- read three indexes because its key index held the waiting rows only: the
-- enqueued and sending ones came from the work in flight, read whole on
-- every call. Over 200,000 reminders with 20,000 in flight (a scratch
-- schema, warm, load ~5): a learner's prefix 0.04-0.16 ms against version
-- 27's 16-90 ms, a campaign's (66,000 keys, limit 1,000) 5-21 ms against
-- 36-180 ms. A sending row is answered 'sending' whether or not it has a
-- lease, as version 14 answered it.
CREATE OR REPLACE FUNCTION nudge_cancel_prefix(p_tenant text, p_key_prefix text, p_limit integer DEFAULT 1000,
                                               p_actor text DEFAULT 'intake',
                                               p_reason text DEFAULT 'canceled by application')
RETURNS SETOF nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    IF p_key_prefix IS NULL OR p_key_prefix = '' THEN
        RAISE EXCEPTION 'nudge: field "key_prefix" is required (an empty prefix would match every key)'
            USING ERRCODE = '22023', COLUMN = 'key_prefix';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION 'nudge: field "limit" must be from 1 to 10000, got %', coalesce(p_limit::text, 'NULL')
            USING ERRCODE = '22023', COLUMN = 'limit';
    END IF;
    RETURN QUERY
    WITH picked AS MATERIALIZED (
        SELECT s.id, r.key, s.state
          FROM reminders r JOIN reminder_state s ON s.id = r.id
         WHERE r.tenant = p_tenant AND r.key LIKE nudge_key_prefix_pattern(p_key_prefix)
           AND s.state IN ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined')
         ORDER BY s.id
         LIMIT p_limit
           FOR UPDATE OF s
    ), canceled AS (
        UPDATE reminder_state s
           SET state = 'canceled', fence = s.fence + 1, lease_until = NULL, reason = p_reason,
               updated_at = now(), finished_at = now()
          FROM picked p
         WHERE s.id = p.id AND p.state <> 'sending'
        RETURNING s.id, p.state AS from_state, s.fence
    ), events AS (
        INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
        SELECT c.id, c.from_state, 'canceled', c.fence, p_actor, 'canceled', p_reason, now()
          FROM canceled c
    )
    SELECT p.id, p.key,
           CASE WHEN p.state = 'sending' THEN 'sending' ELSE 'changed' END,
           CASE WHEN p.state = 'sending' THEN 'sending' ELSE 'canceled' END
      FROM picked p
     ORDER BY p.id;
END $$;

-- Version 26's: a campaign's reminders are found by key on the wide row
-- (reminders_campaign_keys while it exists, reminders_keys after), and
-- counted by their state on reminder_state.
CREATE OR REPLACE FUNCTION nudge_campaign_status(p_tenant text, p_id bigint)
RETURNS TABLE (state text, planned bigint, bad bigint, slices bigint, last_checkpoint timestamptz,
               unplanned bigint, late_slices bigint, deadline timestamptz, deliveries jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    RETURN QUERY
    SELECT c.state, c.planned, c.bad, c.fence,
           (SELECT cs.at FROM campaign_slices cs WHERE cs.campaign_id = c.id ORDER BY cs.slice DESC LIMIT 1),
           c.unplanned,
           -- In the campaign's slice size (NULL from schema 25 on: the
           -- planner's; then its largest slice so far, or 200).
           (SELECT CASE WHEN c.state = 'late' THEN (coalesce(c.unplanned, 0) + z.size - 1) / z.size ELSE 0 END
              FROM (SELECT coalesce(c.slice_size, (SELECT max(cs.rows_read) FROM campaign_slices cs
                                                    WHERE cs.campaign_id = c.id), 200) AS size) z)::bigint,
           c.deadline,
           (SELECT coalesce(jsonb_object_agg(d.state, d.n), '{}'::jsonb)
              FROM (SELECT s.state, count(*) AS n
                      FROM reminders r JOIN reminder_state s ON s.id = r.id
                     WHERE r.tenant = c.tenant AND r.key LIKE 'campaign:%'
                       AND r.key ~>=~ ('campaign:' || c.id || ':') AND r.key ~<~ ('campaign:' || c.id || ';')
                     GROUP BY s.state) d)
      FROM campaigns c
     WHERE c.id = p_id AND c.tenant = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'nudge: tenant % has no campaign %', quote_literal(p_tenant), p_id USING ERRCODE = 'P0002';
    END IF;
END $$;

-- CREATE OR REPLACE kept the grants but not the settings: the SECURITY
-- DEFINER ones pinned to this schema again (the _unchecked bodies run
-- under their wrappers' setting, as before).
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'nudge_reschedule_window(text, text, timestamptz, timestamptz, time, time, integer, text, text)',
        'nudge_reschedule_to(text, text, timestamptz, timestamptz, text, text)',
        'nudge_update(text, text, text, text, jsonb, text, text)',
        'nudge_cancel_prefix(text, text, integer, text, text)',
        'nudge_campaign_status(text, bigint)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END $$;

-- Version 30's timeline, the folded events read from the state row, where
-- their slots are written. Same columns, same order, same grants
-- (CREATE OR REPLACE VIEW keeps them); security_invoker as before.
CREATE OR REPLACE VIEW reminder_timeline WITH (security_invoker = true) AS
SELECT t.id, t.reminder_id, t.from_state, t.to_state, t.fence, t.actor, t.code, t.reason, t.at,
       row_number() OVER (PARTITION BY t.reminder_id
                          ORDER BY t.fence, t.stage, t.at, t.id NULLS LAST)::integer AS seq
  FROM (SELECT e.id, e.reminder_id, e.from_state, e.to_state, e.fence, e.actor, e.code, e.reason, e.at,
               CASE WHEN e.code IN ('claimed', 'attempt_claimed') THEN 0 ELSE 1 END AS stage
          FROM reminder_events e
        UNION ALL
        SELECT NULL::bigint, s.id, f.from_state, f.to_state, f.fence, f.actor, f.code, f.reason, f.at, f.stage
          FROM reminder_state s
         CROSS JOIN LATERAL nudge_folded_events(s.claimed_at, s.claimed_fence, s.claimed_by, s.started_at,
                                                s.started_fence, s.started_by, s.delivered_by, s.fence,
                                                s.finished_at, s.reason) f
         WHERE s.claimed_at IS NOT NULL OR s.started_at IS NOT NULL OR s.delivered_by IS NOT NULL) t;

-- Version 30's check on the folded events retention stores, against the
-- state row (the deleting statement still sees it: the cascade from
-- reminders runs at the statement's end).
ALTER POLICY nudge_retention_keeps_folded ON reminder_events
    WITH CHECK (code IN ('claimed', 'attempt_claimed', 'delivered')
                AND EXISTS (SELECT 1 FROM reminder_state s
                             WHERE s.id = reminder_id AND s.state IN ('delivered', 'failed', 'expired', 'canceled')));
