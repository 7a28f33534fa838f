-- Schema version 39: every function reads and writes a reminder that has no
-- reminder_state row yet (issue 18, the due-ordered store's slices 2 and 3:
-- "A due-ordered store for the spread claim" in docs/benchmarks.md).
--
-- In that design a reminder due far ahead gets its state row from a
-- promoter shortly before it is due, not at intake. Until then the wide row
-- (reminders) holds its intent as recorded: due_at, deadline, tz and
-- window. Such a reminder is pending, at fence 0, with no attempt. Nothing
-- here makes one (intake still writes every state row); this makes every
-- function correct for one, with the same answers as before for a reminder
-- that has its row:
--
-- - nudge_materialize(ids) inserts the missing state rows of those
--   reminders from their wide rows, the columns intake inserts, ON CONFLICT
--   DO NOTHING: a row that exists, or that the promoter inserts meanwhile,
--   is kept as it is (a materialized and then canceled reminder stays
--   canceled when the promoter reaches it). The NOT EXISTS spares a reminder
--   that has its row the speculative insertion: for it, one probe of
--   reminder_state's primary key, nothing written.
-- - Every function that writes one reminder's state (cancel, reschedule,
--   reschedule_window, reschedule_to, update) materializes it first, then
--   runs as in 34: it locks and writes the state row (FOR UPDATE OF s).
--   nudge_cancel_prefix materializes the unpromoted reminders among the
--   batch it is about to cancel (the first p_limit open or unpromoted keys
--   under the prefix, by id), then picks that batch as before.
-- - nudge_campaign_status counts a campaign's reminders without a state row
--   as pending: each run of consecutive ids [lo, hi] holds hi - lo + 1
--   reminders of the campaign, so those missing from reminder_state's range
--   are the unpromoted ones; no read is added.
-- - nudge_unpromoted_due(p_due_by) is the one place that finds the
--   reminders without a state row due by a time, counted and with their
--   oldest due time (and oldest deadline by then) by channel and tenant:
--   internal/ops' statistics and internal/metrics' gauges add it to the
--   pending ones. Only a reminder intake left lazy can lack its row, and
--   below the promoter's final watermark (schema 38: nudge_promoter
--   .final_until) every one has it, so it reads reminders_due_order from
--   final_until to p_due_by: a range as long as the promoter's lag (empty
--   while lazy intake is off), not the table. p_due_by 'infinity' (nudgectl
--   stats' counts) reads every lazy reminder not yet due as well.
--
-- The reminder_timeline view needs no change: a reminder's events are
-- reminder_events' (the 'scheduled' one is written at intake), and the
-- folded ones come from a state row only once claimed.
--
-- CREATE OR REPLACE keeps the signatures, the answers and the grants; the
-- SECURITY DEFINER functions' search_path is pinned again at the end.
-- Release N-1's binaries call these functions too (they live in the
-- database): for a reminder with its state row they do what 34 and 36 did.

CREATE OR REPLACE FUNCTION nudge_materialize(p_ids bigint[]) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days)
    SELECT r.id, r.tenant, r.channel, r.due_at, r.deadline, r.tz, r.window_open, r.window_close, r.window_days
      FROM reminders r
     WHERE r.id = ANY(p_ids)
       AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)
     ORDER BY r.id
        ON CONFLICT (id) DO NOTHING;
$$;

CREATE OR REPLACE FUNCTION nudge_unpromoted_due(p_due_by timestamptz)
RETURNS TABLE (channel text, tenant text, n bigint, oldest timestamptz, oldest_deadline timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT r.channel, r.tenant, count(*), min(r.due_at), min(r.deadline) FILTER (WHERE r.deadline <= p_due_by)
      FROM reminders r
     WHERE r.lazy
       AND r.due_at >= (SELECT p.final_until FROM nudge_promoter p)
       AND r.due_at <= p_due_by
       AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)
     GROUP BY r.channel, r.tenant;
$$;

-- 34's body, materializing first.
CREATE OR REPLACE FUNCTION nudge_cancel_unchecked(p_tenant text, p_key text, p_actor text DEFAULT 'intake',
                                                  p_reason text DEFAULT 'canceled by application')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    cur record;
BEGIN
    PERFORM nudge_materialize(ARRAY(SELECT r.id FROM reminders r WHERE r.tenant = p_tenant AND r.key = p_key));
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

-- 34's body, materializing first.
CREATE OR REPLACE FUNCTION nudge_reschedule_unchecked(p_tenant text, p_key text, p_due_at timestamptz,
                                                      p_deadline timestamptz, p_actor text DEFAULT 'intake',
                                                      p_reason text DEFAULT 'rescheduled by application')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    cur     record;
    invalid text[];
BEGIN
    PERFORM nudge_materialize(ARRAY(SELECT r.id FROM reminders r WHERE r.tenant = p_tenant AND r.key = p_key));
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

-- 34's body, materializing first.
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
    PERFORM nudge_materialize(ARRAY(SELECT r.id FROM reminders r WHERE r.tenant = p_tenant AND r.key = p_key));
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

-- 34's body; the window of a reminder without its state row is the wide
-- row's (what nudge_reschedule_window's materialization then copies).
CREATE OR REPLACE FUNCTION nudge_reschedule_to(p_tenant text, p_key text, p_due_at timestamptz, p_deadline timestamptz,
                                               p_actor text DEFAULT 'intake',
                                               p_reason text DEFAULT 'rescheduled by application')
RETURNS nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    w record;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    SELECT CASE WHEN s.id IS NULL THEN r.window_open ELSE s.window_open END AS window_open,
           CASE WHEN s.id IS NULL THEN r.window_close ELSE s.window_close END AS window_close,
           CASE WHEN s.id IS NULL THEN r.window_days ELSE s.window_days END AS window_days INTO w
      FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id
     WHERE r.tenant = p_tenant AND r.key = p_key;
    RETURN nudge_reschedule_window(p_tenant, p_key, p_due_at, p_deadline,
                                   w.window_open, w.window_close, w.window_days, p_actor, p_reason);
END $$;

-- 34's body, materializing first.
CREATE OR REPLACE FUNCTION nudge_update(p_tenant text, p_key text, p_recipient text, p_template text, p_data jsonb,
                                        p_actor text DEFAULT 'intake', p_reason text DEFAULT 'updated by application')
RETURNS nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    cur     record;
    invalid text[];
    refused text;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    PERFORM nudge_materialize(ARRAY(SELECT r.id FROM reminders r WHERE r.tenant = p_tenant AND r.key = p_key));
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

-- 34's body. First the batch's unpromoted reminders get their state rows:
-- the batch is the first p_limit keys under the prefix, by id, that are
-- open or have no state row yet, which after their materialization are
-- exactly the first p_limit open ones that picked then locks (a row that
-- moves on in between is left out, as before).
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
    PERFORM nudge_materialize(ARRAY(
        SELECT b.id
          FROM (SELECT r.id, s.id AS promoted
                  FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id
                 WHERE r.tenant = p_tenant AND r.key LIKE nudge_key_prefix_pattern(p_key_prefix)
                   AND (s.id IS NULL OR s.state IN ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined'))
                 ORDER BY r.id
                 LIMIT p_limit) b
         WHERE b.promoted IS NULL));
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

-- 36's body; a run's ids that reminder_state's range lacks are counted as
-- pending.
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
           (WITH runs AS MATERIALIZED (
                SELECT min(k.id) AS lo, max(k.id) AS hi
                  FROM (SELECT r.id, r.id - row_number() OVER (ORDER BY r.id) AS run
                          FROM reminders r
                         WHERE r.tenant = c.tenant AND r.key LIKE 'campaign:%'
                           AND r.key ~>=~ ('campaign:' || c.id || ':')
                           AND r.key ~<~ ('campaign:' || c.id || ';')) k
                 GROUP BY k.run
            ), promoted AS MATERIALIZED (
                SELECT s.state, count(*) AS n
                  FROM runs JOIN LATERAL (SELECT s.state FROM reminder_state s
                                           WHERE s.id BETWEEN runs.lo AND runs.hi) s ON true
                 GROUP BY s.state
            )
            SELECT coalesce(jsonb_object_agg(d.state, d.n), '{}'::jsonb)
              FROM (SELECT t.state, sum(t.n)::bigint AS n
                      FROM (SELECT p.state, p.n FROM promoted p
                            UNION ALL
                            SELECT 'pending', (SELECT coalesce(sum(runs.hi - runs.lo + 1), 0) FROM runs)
                                              - (SELECT coalesce(sum(p.n), 0) FROM promoted p)) t
                     GROUP BY t.state
                    HAVING sum(t.n) > 0) d)
      FROM campaigns c
     WHERE c.id = p_id AND c.tenant = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'nudge: tenant % has no campaign %', quote_literal(p_tenant), p_id USING ERRCODE = 'P0002';
    END IF;
END $$;

-- CREATE OR REPLACE kept the grants but not the settings: the SECURITY
-- DEFINER ones pinned to this schema again.
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

-- The reconciler's gauges (internal/metrics DBGauges) call
-- nudge_unpromoted_due under its own grants: it reads the lazy column
-- (schema 38) beside those it already reads; nudge_promoter it reads since 38.
GRANT SELECT (lazy) ON reminders TO nudge_reconciler;
