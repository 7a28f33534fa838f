-- Nudge schema, version 13: recipient-local time on every intake path, and
-- send windows (issue 14, second slice; rules in docs/local-time.md).
--
-- 1. A reminder has a zone (tz) and may have a send window of its own
--    (window_open, window_close, window_days: the SQL twin's (open, close,
--    days) of migration 0011). A per-tenant, per-channel policy gives the
--    window of the reminders that name none (nudge_send_windows, with
--    default rows for tenant '*').
-- 2. The intake functions take the zone, local wall-clock due times and
--    deadlines, and a window, as optional arguments: the calls of earlier
--    versions keep working unchanged.
-- 3. The dispatcher may move a pending reminder's due_at to its window's
--    next opening (ClaimDue); requested_due_at keeps what intake asked for,
--    which is what a repeat of the same intake is compared with.
--
-- Rolling upgrade: every new column is nullable without a default, so the
-- writes of version-12 binaries (which name none of them) keep working and
-- mean "UTC, no window of its own". Version-12 dispatchers and workers ignore
-- windows until they are replaced: roll them out before setting windows.

-- ---------------------------------------------------------------------------
-- Columns.

-- tz: the recipient's IANA zone; NULL means UTC. The full check (a zone the
-- server knows, nudge_valid_tz) is made where a zone enters, by the intake
-- functions: a CHECK constraint may not read a table. This one is immutable
-- and refuses what is never a zone.
ALTER TABLE reminders ADD COLUMN tz text;
-- The reminder's own send window, or all NULL for "the policy's". The SQL
-- twin's representation: window_open NULL (with a close) means any time;
-- window_close '24:00' is the end of the day, one before the open is
-- overnight; window_days is a bit set, bit 1 << extract(dow), 0 every day.
ALTER TABLE reminders ADD COLUMN window_open time;
ALTER TABLE reminders ADD COLUMN window_close time;
ALTER TABLE reminders ADD COLUMN window_days integer;
-- The due time intake asked for, once the dispatcher has moved due_at to a
-- window's opening (NULL: due_at is it).
ALTER TABLE reminders ADD COLUMN requested_due_at timestamptz;

-- NOT VALID: every existing row is NULL, and the constraints hold for every
-- row written from now on. A CHECK runs on every UPDATE of a row, as the
-- updating role: nudge_retention (PurgePayloads) needs nudge_tz_name_allowed
-- too (granted below; the component roles have it since version 11).
ALTER TABLE reminders ADD CONSTRAINT reminders_tz_name CHECK (tz IS NULL OR nudge_tz_name_allowed(tz)) NOT VALID;
ALTER TABLE reminders ADD CONSTRAINT reminders_window CHECK (
    (window_close IS NULL AND window_open IS NULL AND window_days IS NULL)
    OR (window_close IS NOT NULL AND window_close <> time '00:00' AND window_days BETWEEN 0 AND 127
        AND (window_open IS NULL OR (window_open < time '24:00' AND window_open <> window_close)))) NOT VALID;

-- ---------------------------------------------------------------------------
-- The window policy: per tenant and channel, tenant '*' (and channel '*')
-- for every other one. A reminder with no window of its own uses the most
-- specific row: (tenant, channel), ('*', channel), (tenant, '*'), ('*', '*');
-- with none, any time. Managed by the owner, as nudge_intake_tenants is:
--   INSERT INTO nudge_send_windows VALUES ('acme', 'sms', '08:00', '21:00', 0)
--   ON CONFLICT (tenant, channel) DO UPDATE SET window_open = excluded.window_open,
--      window_close = excluded.window_close, window_days = excluded.window_days;
CREATE TABLE nudge_send_windows (
    tenant       text    NOT NULL CHECK (tenant <> ''),
    channel      text    NOT NULL CHECK (channel <> ''),
    window_open  time,
    window_close time    NOT NULL DEFAULT '24:00',
    window_days  integer NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, channel),
    CONSTRAINT nudge_send_windows_window CHECK (
        window_close <> time '00:00' AND window_days BETWEEN 0 AND 127
        AND (window_open IS NULL OR (window_open < time '24:00' AND window_open <> window_close)))
);
-- The defaults: any time, on every channel (a window is opted into).
INSERT INTO nudge_send_windows (tenant, channel, window_open) VALUES ('*', '*', NULL);

-- The send window that applies to a reminder of p_tenant on p_channel whose
-- own window is (p_open, p_close, p_days): its own when p_close is set, else
-- the policy's, else any time. window_open NULL means any time. One row; a
-- SQL function so that a claim inlines it.
CREATE FUNCTION nudge_send_window(p_tenant text, p_channel text, p_open time, p_close time, p_days integer)
RETURNS TABLE (window_open time, window_close time, window_days integer)
LANGUAGE sql STABLE PARALLEL SAFE ROWS 1 AS $$
    SELECT CASE WHEN p_close IS NOT NULL THEN p_open ELSE p.window_open END,
           coalesce(p_close, p.window_close, time '24:00'),
           CASE WHEN p_close IS NOT NULL THEN coalesce(p_days, 0) ELSE coalesce(p.window_days, 0) END
      FROM (SELECT 1) one
      LEFT JOIN LATERAL (
            SELECT s.window_open, s.window_close, s.window_days
              FROM nudge_send_windows s
             WHERE s.tenant IN (p_tenant, '*') AND s.channel IN (p_channel, '*')
             ORDER BY s.tenant = '*', s.channel = '*'
             LIMIT 1) p ON p_close IS NULL
$$;

-- ---------------------------------------------------------------------------
-- Intake.

-- Validates the local-time arguments of one reminder the way every intake
-- path does: NULL when they are valid, else ARRAY[field, what was expected].
-- Checked before nudge_invalid, which sees the resolved instants.
CREATE FUNCTION nudge_invalid_local(
    p_tz text, p_due_at timestamptz, p_due_local timestamp, p_deadline timestamptz, p_deadline_local timestamp,
    p_window_open time, p_window_close time, p_window_days integer)
RETURNS text[] LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_tz IS NOT NULL AND (length(p_tz) > 64 OR NOT nudge_valid_tz(p_tz))
            THEN ARRAY['tz', 'must be an IANA time zone name such as "Europe/Stockholm" or "UTC", got '
                             || quote_literal(left(p_tz, 64))]
        WHEN p_due_at IS NOT NULL AND p_due_local IS NOT NULL
            THEN ARRAY['due_local', 'must not be given with due_at: give the instant or the local time']
        WHEN p_due_local IS NOT NULL AND p_tz IS NULL
            THEN ARRAY['tz', 'is required with due_local (the zone the local time is read in)']
        WHEN p_deadline IS NOT NULL AND p_deadline_local IS NOT NULL
            THEN ARRAY['deadline_local', 'must not be given with deadline: give the instant or the local time']
        WHEN p_deadline_local IS NOT NULL AND p_tz IS NULL
            THEN ARRAY['tz', 'is required with deadline_local (the zone the local time is read in)']
        WHEN (p_window_open IS NOT NULL OR p_window_days IS NOT NULL) AND p_window_close IS NULL
            THEN ARRAY['window', 'needs a closing time']
        WHEN p_window_close IS NOT NULL AND (p_window_close = time '00:00'
                 OR coalesce(p_window_days, 0) NOT BETWEEN 0 AND 127
                 OR p_window_open >= time '24:00' OR p_window_open = p_window_close)
            THEN ARRAY['window', 'must open 00:00-23:59 and close 00:01-24:00 at another time, on days 0-127 (a bit set, Sunday 1)']
    END
$$;

-- The (open, close, days) to store for a window as given: all NULL for none,
-- and any time (00:00-24:00 every day) as open NULL, close 24:00, days 0,
-- as localtime.NewWindow normalises it.
CREATE FUNCTION nudge_window_stored(p_open time, p_close time, p_days integer,
                                    OUT window_open time, OUT window_close time, OUT window_days integer)
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_open = time '00:00' AND p_close = time '24:00' AND coalesce(p_days, 0) IN (0, 127)
                THEN NULL ELSE p_open END,
           p_close,
           CASE WHEN p_close IS NULL THEN NULL WHEN coalesce(p_days, 0) = 127 THEN 0 ELSE coalesce(p_days, 0) END
$$;

-- The intake functions gain the local-time arguments, all defaulted: a call
-- of an earlier version (positional, eight or nine arguments) means the same.
-- A reminder's tz and window are part of its content: a repeat of its key
-- with another zone or window is a conflict, as one with another due time is.
DROP FUNCTION nudge_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz);
DROP FUNCTION nudge_try_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text);
DROP FUNCTION nudge_try_schedule_unchecked(text, text, text, text, text, jsonb, timestamptz, timestamptz, text);

CREATE FUNCTION nudge_try_schedule_unchecked(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz,
    p_actor text DEFAULT 'intake',
    p_tz text DEFAULT NULL, p_due_local timestamp DEFAULT NULL, p_deadline_local timestamp DEFAULT NULL,
    p_window_open time DEFAULT NULL, p_window_close time DEFAULT NULL, p_window_days integer DEFAULT NULL,
    OUT id bigint, OUT status text, OUT field text, OUT reason text)
LANGUAGE plpgsql AS $$
DECLARE
    invalid text[];
    r       reminders%ROWTYPE;
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
        INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
        VALUES (id, NULL, 'pending', 0, p_actor, 'scheduled', 'scheduled', now());
        status := 'created';
        RETURN;
    END IF;

    SELECT * INTO r FROM reminders t WHERE t.tenant = p_tenant AND t.key = p_key;
    id := r.id;
    IF r.channel = p_channel AND r.recipient = p_recipient AND r.template = p_template
       AND r.data = COALESCE(p_data, '{}'::jsonb)
       AND coalesce(r.requested_due_at, r.due_at) = due AND r.deadline = dl
       AND coalesce(r.tz, 'UTC') = coalesce(p_tz, 'UTC')
       AND (r.window_open, r.window_close, r.window_days) IS NOT DISTINCT FROM (w.window_open, w.window_close, w.window_days) THEN
        status := 'exists';
    ELSE
        status := 'conflict'; field := 'key';
        reason := format('key %L of tenant %L is already scheduled with different content', p_key, p_tenant);
    END IF;
END $$;

-- nudge_try_schedule as in version 2, for a tenant the session may act for.
CREATE FUNCTION nudge_try_schedule(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz,
    p_actor text DEFAULT 'intake',
    p_tz text DEFAULT NULL, p_due_local timestamp DEFAULT NULL, p_deadline_local timestamp DEFAULT NULL,
    p_window_open time DEFAULT NULL, p_window_close time DEFAULT NULL, p_window_days integer DEFAULT NULL,
    OUT id bigint, OUT status text, OUT field text, OUT reason text)
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF nullif(btrim(p_tenant), '') IS NOT NULL THEN
        PERFORM nudge_check_tenant(p_tenant);
    END IF;
    SELECT u.id, u.status, u.field, u.reason INTO id, status, field, reason
      FROM nudge_try_schedule_unchecked(p_tenant, p_key, p_channel, p_recipient, p_template,
                                        p_data, p_due_at, p_deadline, p_actor, p_tz, p_due_local,
                                        p_deadline_local, p_window_open, p_window_close, p_window_days) u;
END $$;

-- nudge_schedule as in version 1, raising on invalid input or a conflict.
-- A local due time: nudge_schedule(..., NULL, NULL, p_tz => 'Europe/Stockholm',
-- p_due_local => '2027-03-28 09:00', p_deadline_local => '2027-03-28 23:59').
CREATE FUNCTION nudge_schedule(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz,
    p_tz text DEFAULT NULL, p_due_local timestamp DEFAULT NULL, p_deadline_local timestamp DEFAULT NULL,
    p_window_open time DEFAULT NULL, p_window_close time DEFAULT NULL, p_window_days integer DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    res record;
BEGIN
    SELECT * INTO res FROM nudge_try_schedule(p_tenant, p_key, p_channel, p_recipient, p_template,
                                              p_data, p_due_at, p_deadline, 'intake', p_tz, p_due_local,
                                              p_deadline_local, p_window_open, p_window_close, p_window_days);
    IF res.status = 'invalid' THEN
        RAISE EXCEPTION 'nudge: field "%" %', res.field, res.reason
            USING ERRCODE = '22023', COLUMN = res.field;
    ELSIF res.status = 'conflict' THEN
        RAISE EXCEPTION 'nudge: %', res.reason
            USING ERRCODE = '23505', COLUMN = 'key', CONSTRAINT = 'reminders_logical_key';
    END IF;
    RETURN res.id;
END $$;

-- A reschedule sets the due time intake asks for: the dispatcher's move, if
-- any, is forgotten. (Version 1's body otherwise; nudge_reschedule, the
-- tenant-checked wrapper of version 10, calls it.)
CREATE OR REPLACE FUNCTION nudge_reschedule_unchecked(p_tenant text, p_key text, p_due_at timestamptz,
                                                      p_deadline timestamptz, p_actor text DEFAULT 'intake',
                                                      p_reason text DEFAULT 'rescheduled by application')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r       reminders%ROWTYPE;
    invalid text[];
BEGIN
    SELECT * INTO r FROM reminders WHERE tenant = p_tenant AND key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    invalid := nudge_invalid(r.tenant, r.key, r.channel, r.recipient, r.template, r.data, p_due_at, p_deadline);
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'nudge: field "%" %', invalid[1], invalid[2] USING ERRCODE = '22023', COLUMN = invalid[1];
    END IF;
    IF r.state IN ('delivered', 'failed', 'expired', 'canceled', 'sending') THEN
        RETURN r.state;
    END IF;
    UPDATE reminders
       SET state = 'pending', fence = fence + 1, lease_until = NULL, next_attempt_at = NULL,
           due_at = p_due_at, requested_due_at = NULL, deadline = p_deadline, reason = NULL, updated_at = now()
     WHERE id = r.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    VALUES (r.id, r.state, 'pending', r.fence + 1, p_actor, 'rescheduled', p_reason, now());
    RETURN 'pending';
END $$;

-- ---------------------------------------------------------------------------
-- Privileges.

DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'nudge_try_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text, text, timestamp, timestamp, time, time, integer)',
        'nudge_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text, timestamp, timestamp, time, time, integer)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END $$;

REVOKE EXECUTE ON FUNCTION
    nudge_try_schedule_unchecked(text, text, text, text, text, jsonb, timestamptz, timestamptz, text, text, timestamp, timestamp, time, time, integer),
    nudge_try_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text, text, timestamp, timestamp, time, time, integer),
    nudge_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text, timestamp, timestamp, time, time, integer),
    nudge_send_window(text, text, time, time, integer)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    nudge_try_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text, text, timestamp, timestamp, time, time, integer),
    nudge_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text, timestamp, timestamp, time, time, integer)
  TO nudge_intake, nudge_operator;
GRANT EXECUTE ON FUNCTION nudge_send_window(text, text, time, time, integer)
  TO nudge_dispatcher, nudge_worker, nudge_operator;

GRANT EXECUTE ON FUNCTION nudge_tz_name_allowed(text) TO nudge_retention;

-- Intake (the functions above run as their owner) and nudgectl schedule
-- (pkg/intake's set-based statement) set the zone and the window.
GRANT INSERT (tz, window_open, window_close, window_days) ON reminders TO nudge_operator;
GRANT SELECT ON nudge_send_windows TO nudge_dispatcher, nudge_worker, nudge_operator;
-- ClaimDue reads the zone and window of the rows it picked and may move a
-- closed window's row to its next opening.
GRANT SELECT (tz, window_open, window_close, window_days, requested_due_at) ON reminders TO nudge_dispatcher;
GRANT UPDATE (due_at, requested_due_at) ON reminders TO nudge_dispatcher;
-- The worker checks the window before it claims and before it sends.
GRANT SELECT (tz, window_open, window_close, window_days) ON reminders TO nudge_worker;
