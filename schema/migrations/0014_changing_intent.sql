-- Nudge schema, version 14: intent the web tier can change (issue 14).
--
-- An application changes what it asked for from its own transaction, as it
-- schedules: new times (nudge_reschedule_to), new content (nudge_update), or
-- every reminder under a key prefix canceled at once (nudge_cancel_prefix:
-- a learner's eligibility ended). Each answers what it did as rows of
-- nudge_change, and a change that cannot or need not be made is an answer
-- too, never an exception:
--
--   status      meaning                                             state
--   changed     the reminder changed (under a new fence)            its state now
--   unchanged   it already is as asked: nothing written             its state
--   not_found   no reminder of the tenant has the key               NULL
--   terminal    it already ended: nothing changed                   the end state
--   sending     a send is in flight: too late to change it; the     sending
--               outcome will be recorded
--
-- Invalid input (a deadline before the due time, a bad recipient) raises as
-- nudge_schedule does (SQLSTATE 22023, message 'nudge: field "F" R'), and a
-- tenant the session may not act for raises 42501, whether or not the key
-- exists, as nudge_cancel does.
--
-- A change moves the reminder back to pending under a new fence: a message
-- already queued for the old version is discarded by the worker (it claims
-- under the message's fence), and the dispatcher publishes the new version.
-- The idempotency key stays that of (tenant, key): one logical reminder, one
-- send at most, whichever version it carries.
--
-- nudge_reschedule (version 1, answering a state as text) stays for the
-- callers that use it. The window part of a reschedule (a send window, a
-- recipient's zone) comes with the migration that adds those columns.

CREATE TYPE nudge_change AS (
    id     bigint,
    key    text,
    status text,
    state  text
);

-- The no-op status of a reminder in p_state that no change may touch
-- ('terminal' or 'sending'), or NULL when it may be changed.
CREATE FUNCTION nudge_change_refused(p_state text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_state IN ('delivered', 'failed', 'expired', 'canceled') THEN 'terminal'
        WHEN p_state = 'sending' THEN 'sending'
    END
$$;

-- The LIKE pattern matching every key that starts with p_prefix.
CREATE FUNCTION nudge_key_prefix_pattern(p_prefix text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT replace(replace(replace(p_prefix, '\', '\\'), '%', '\%'), '_', '\_') || '%'
$$;

-- Open and sending reminders by key, bytewise (text_pattern_ops, so a LIKE
-- prefix uses it under any collation): what nudge_cancel_prefix selects. It
-- holds open rows only, like the other partial indexes, so it stays as small
-- as the backlog.
CREATE INDEX reminders_open_keys ON reminders (tenant, key text_pattern_ops)
    WHERE state IN ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined');

-- New due and deadline times for the reminder (tenant, key): nudge_reschedule
-- answering a nudge_change row, and unchanged (nothing written, no new
-- fence) when the times are the ones it has.
CREATE FUNCTION nudge_reschedule_to(p_tenant text, p_key text, p_due_at timestamptz, p_deadline timestamptz,
                                    p_actor text DEFAULT 'intake',
                                    p_reason text DEFAULT 'rescheduled by application')
RETURNS nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    r       reminders%ROWTYPE;
    invalid text[];
    refused text;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    SELECT * INTO r FROM reminders WHERE tenant = p_tenant AND key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN ROW(NULL, p_key, 'not_found', NULL)::nudge_change;
    END IF;
    invalid := nudge_invalid(r.tenant, r.key, r.channel, r.recipient, r.template, r.data, p_due_at, p_deadline);
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'nudge: field "%" %', invalid[1], invalid[2] USING ERRCODE = '22023', COLUMN = invalid[1];
    END IF;
    refused := nudge_change_refused(r.state);
    IF refused IS NOT NULL THEN
        RETURN ROW(r.id, r.key, refused, r.state)::nudge_change;
    END IF;
    -- The due time asked for (requested_due_at, schema 13), not the one the
    -- dispatcher may have moved to a send window's opening.
    IF coalesce(r.requested_due_at, r.due_at) = p_due_at AND r.deadline = p_deadline THEN
        RETURN ROW(r.id, r.key, 'unchanged', r.state)::nudge_change;
    END IF;
    UPDATE reminders
       SET state = 'pending', fence = fence + 1, lease_until = NULL, next_attempt_at = NULL,
           due_at = p_due_at, requested_due_at = NULL, deadline = p_deadline, reason = NULL,
           updated_at = now()
     WHERE id = r.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    VALUES (r.id, r.state, 'pending', r.fence + 1, p_actor, 'rescheduled', p_reason, now());
    RETURN ROW(r.id, r.key, 'changed', 'pending')::nudge_change;
END $$;

-- New content for the reminder (tenant, key): a new version. A NULL
-- argument keeps what the reminder has (so nudge_update(t, k, NULL, NULL,
-- '{"course": "Go 102"}') changes the data alone); the channel, the due time
-- and the deadline are kept. Unchanged when the content is the same.
CREATE FUNCTION nudge_update(p_tenant text, p_key text, p_recipient text, p_template text, p_data jsonb,
                             p_actor text DEFAULT 'intake', p_reason text DEFAULT 'updated by application')
RETURNS nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    r       reminders%ROWTYPE;
    invalid text[];
    refused text;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    SELECT * INTO r FROM reminders WHERE tenant = p_tenant AND key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN ROW(NULL, p_key, 'not_found', NULL)::nudge_change;
    END IF;
    p_recipient := coalesce(p_recipient, r.recipient);
    p_template := coalesce(p_template, r.template);
    p_data := coalesce(p_data, r.data);
    invalid := nudge_invalid(r.tenant, r.key, r.channel, p_recipient, p_template, p_data, r.due_at, r.deadline);
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'nudge: field "%" %', invalid[1], invalid[2] USING ERRCODE = '22023', COLUMN = invalid[1];
    END IF;
    refused := nudge_change_refused(r.state);
    IF refused IS NOT NULL THEN
        RETURN ROW(r.id, r.key, refused, r.state)::nudge_change;
    END IF;
    IF r.recipient = p_recipient AND r.template = p_template AND r.data = p_data THEN
        RETURN ROW(r.id, r.key, 'unchanged', r.state)::nudge_change;
    END IF;
    UPDATE reminders
       SET recipient = p_recipient, template = p_template, data = p_data,
           state = 'pending', fence = fence + 1, lease_until = NULL, next_attempt_at = NULL,
           reason = NULL, updated_at = now()
     WHERE id = r.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    VALUES (r.id, r.state, 'pending', r.fence + 1, p_actor, 'updated', p_reason, now());
    RETURN ROW(r.id, r.key, 'changed', 'pending')::nudge_change;
END $$;

-- Cancels the open reminders of p_tenant whose key starts with p_key_prefix
-- (exactly: no wildcards), at most p_limit of them (1 to 10,000), oldest
-- first. Answers one row per reminder it touched: 'changed' (now canceled),
-- or 'sending' for one being sent (too late to stop). Reminders that already
-- ended are left out. Fewer 'changed' rows than p_limit means none is left
-- open; as many means call it again.
CREATE FUNCTION nudge_cancel_prefix(p_tenant text, p_key_prefix text, p_limit integer DEFAULT 1000,
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
        SELECT r.id, r.key, r.state
          FROM reminders r
         WHERE r.tenant = p_tenant AND r.key LIKE nudge_key_prefix_pattern(p_key_prefix)
           AND r.state IN ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined')
         ORDER BY r.id
         LIMIT p_limit
           FOR UPDATE
    ), canceled AS (
        UPDATE reminders r
           SET state = 'canceled', fence = r.fence + 1, lease_until = NULL, reason = p_reason,
               updated_at = now(), finished_at = now()
          FROM picked p
         WHERE r.id = p.id AND p.state <> 'sending'
        RETURNING r.id, p.state AS from_state, r.fence
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

-- Pinned to this schema, as every SECURITY DEFINER function of version 2.
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'nudge_reschedule_to(text, text, timestamptz, timestamptz, text, text)',
        'nudge_update(text, text, text, text, jsonb, text, text)',
        'nudge_cancel_prefix(text, text, integer, text, text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END $$;

REVOKE EXECUTE ON FUNCTION
    nudge_reschedule_to(text, text, timestamptz, timestamptz, text, text),
    nudge_update(text, text, text, text, jsonb, text, text),
    nudge_cancel_prefix(text, text, integer, text, text)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    nudge_reschedule_to(text, text, timestamptz, timestamptz, text, text),
    nudge_update(text, text, text, text, jsonb, text, text),
    nudge_cancel_prefix(text, text, integer, text, text)
  TO nudge_intake, nudge_operator;
