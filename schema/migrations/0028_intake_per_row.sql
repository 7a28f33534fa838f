-- Schema version 28: nudge_schedule, called once per reminder, at close to
-- the cost of the set-based bulk intake (issue 18). Measured with
-- BenchmarkScheduleFunctionVsBulk (pkg/intake), the backend's CPU per call
-- went to three things besides the rows it writes:
--
-- 1. nudge_invalid was not inlined. nudge_invalid_email_sms (version 10's
--    nudge_invalid) builds one message with text || integer, which is
--    anytextcat, STABLE; an IMMUTABLE SQL function whose body holds a
--    STABLE call is not inlined, so every call (and every row of the bulk
--    statement, whose comment says it is inlined) ran it through the SQL
--    function executor, planning its body each time. The integer is cast
--    to text first: the message is the same, the function inlines again.
CREATE OR REPLACE FUNCTION nudge_invalid_email_sms(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_tenant IS NULL OR btrim(p_tenant) = '' THEN ARRAY['tenant', 'is required']
        WHEN length(p_tenant) > 128 THEN ARRAY['tenant', 'must be at most 128 characters']
        WHEN p_key IS NULL OR btrim(p_key) = '' THEN ARRAY['key', 'is required']
        WHEN length(p_key) > 512 THEN ARRAY['key', 'must be at most 512 characters']
        WHEN p_channel IS NULL OR p_channel NOT IN ('email', 'sms') THEN ARRAY['channel', 'must be "email" or "sms"']
        WHEN p_recipient IS NULL OR btrim(p_recipient) = '' THEN ARRAY['recipient', 'is required']
        -- Before the patterns, so that they never scan a huge string.
        WHEN length(p_recipient) > 254 THEN ARRAY['recipient', 'must be at most 254 characters']
        WHEN p_channel = 'email' AND p_recipient !~ '^[^@\s<>]+@[^@\s<>]+\.[^@\s<>]+$'
            THEN ARRAY['recipient', 'must be an email address like name@example.com']
        WHEN p_channel = 'sms' AND p_recipient !~ '^\+[1-9][0-9]{6,14}$'
            THEN ARRAY['recipient', 'must be an E.164 phone number like +14155550100']
        -- (length, not a {0,127} bound: bounded repetition costs 15 µs a row)
        WHEN length(p_template) > 128 THEN ARRAY['template', 'must be at most 128 characters']
        WHEN p_template IS NULL OR p_template !~ '^[a-z0-9][a-z0-9._-]*$'
            THEN ARRAY['template', 'must be a template name of lowercase letters, digits, ".", "_" or "-"']
        WHEN p_data IS NULL OR jsonb_typeof(p_data) <> 'object' THEN ARRAY['data', 'must be a JSON object']
        WHEN octet_length(p_data::text) > 65536
            THEN ARRAY['data', 'must be at most 65536 bytes as JSON, got ' || octet_length(p_data::text)::text]
        WHEN p_due_at IS NULL THEN ARRAY['due_at', 'is required (RFC 3339 time)']
        WHEN p_deadline IS NULL THEN ARRAY['deadline', 'is required (RFC 3339 time)']
        WHEN p_deadline <= p_due_at THEN ARRAY['deadline', 'must be after due_at']
    END
$$;

-- 2. nudge_tenant_allowed, a SQL function with SECURITY DEFINER and a
--    search_path (so never inlined), planned its EXISTS over
--    nudge_intake_tenants and pg_roles afresh in every transaction: every
--    call of a web tier's login. In PL/pgSQL the plan is kept for the
--    session. Same expression, same result. CREATE OR REPLACE drops the
--    function's search_path setting: it is set again below.
CREATE OR REPLACE FUNCTION nudge_tenant_allowed(p_tenant text) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    RETURN p_tenant IS NOT NULL
       AND p_tenant = coalesce(nullif(current_setting('nudge.tenant', true), ''), p_tenant)
       AND (has_any_column_privilege(session_user, 'reminders', 'INSERT')
            OR EXISTS (SELECT 1
                         FROM nudge_intake_tenants g
                         JOIN pg_catalog.pg_roles r ON r.rolname = g.grantee
                        WHERE g.tenant IN (p_tenant, '*')
                          AND pg_has_role(session_user, r.oid, 'MEMBER')));
END $$;

-- 3. nudge_schedule called nudge_try_schedule, a second PL/pgSQL wrapper
--    with its own SECURITY DEFINER and search_path switch, which called
--    nudge_check_tenant, a third, before the body. nudge_schedule is now the
--    SECURITY DEFINER wrapper itself: the same check (nudge_check_tenant
--    only raises the refusal, as before, when nudge_tenant_allowed says no),
--    the same body (nudge_try_schedule_unchecked, the one every intake
--    function shares), the same errors. Its grants are unchanged.
CREATE OR REPLACE FUNCTION nudge_schedule(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz,
    p_tz text DEFAULT NULL, p_due_local timestamp DEFAULT NULL, p_deadline_local timestamp DEFAULT NULL,
    p_window_open time DEFAULT NULL, p_window_close time DEFAULT NULL, p_window_days integer DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    res record;
BEGIN
    IF nullif(btrim(p_tenant), '') IS NOT NULL AND NOT nudge_tenant_allowed(p_tenant) THEN
        PERFORM nudge_check_tenant(p_tenant); -- raises the refusal
    END IF;
    res := nudge_try_schedule_unchecked(p_tenant, p_key, p_channel, p_recipient, p_template,
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

-- 4. nudge_window_stored, a SQL function with OUT parameters (a record,
--    which the planner never inlines), was parsed and planned in every
--    transaction that called it, and run through the SQL function executor
--    for every row of the bulk statement. In PL/pgSQL its expressions are
--    planned once per session and evaluated without the executor. Same
--    results.
CREATE OR REPLACE FUNCTION nudge_window_stored(p_open time, p_close time, p_days integer,
                                               OUT window_open time, OUT window_close time, OUT window_days integer)
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    window_open := CASE WHEN p_open = time '00:00' AND p_close = time '24:00' AND coalesce(p_days, 0) IN (0, 127)
                        THEN NULL ELSE p_open END;
    window_close := p_close;
    window_days := CASE WHEN p_close IS NULL THEN NULL WHEN coalesce(p_days, 0) = 127 THEN 0 ELSE coalesce(p_days, 0) END;
END $$;

-- 5. The zone CHECK called nudge_tz_name_allowed, a SQL function the
--    planner inlines: which means parsing its body again each time a
--    statement's constraints are prepared, that is in every INSERT or UPDATE
--    statement on reminders (per call of nudge_schedule; per batch for the
--    bulk path, the dispatcher and the workers). The CHECK now holds the
--    same test itself, the list of refused names folded into the pattern
--    (a text array constant is stored, and read back for every statement,
--    as a list of its bytes, several times the length). NOT VALID as before, so it is swapped without
--    reading the table (under a brief lock); the rows it checked still pass.
ALTER TABLE reminders
    DROP CONSTRAINT reminders_tz_name,
    ADD CONSTRAINT reminders_tz_name CHECK (
        tz IS NULL
        OR (tz <> '' AND tz = btrim(tz)
            AND tz !~ '^((posix|right)/.*|Local|localtime|posixrules|Factory|CET|EET|MET|WET|EST|MST|HST)$')) NOT VALID;

DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'nudge_tenant_allowed(text)',
        'nudge_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text, timestamp, timestamp, time, time, integer)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END $$;
