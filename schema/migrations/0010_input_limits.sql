-- Nudge schema, version 10: hostile input.
--
-- 1. nudge_invalid bounds every field's size, so that what a web tier can
--    store is bounded too: the recipient (254 characters) and the data (64 KiB
--    as PostgreSQL prints the stored jsonb, which is what every reader of the
--    row receives: a 13-byte 1e131071 prints as 131,072 digits). The numbers
--    are pkg/intake's Max* constants (limits.go), which the Go paths check
--    before sending; TestLimitsAreTheSameInGoAndSQL keeps the two equal.
--    What PostgreSQL itself cannot hold (a NUL character, invalid UTF-8, a
--    \u0000 escape in jsonb) never reaches a function: the server refuses the
--    parameter (SQLSTATE 22021 or 22P05) before the call.
--
-- 2. nudge_reschedule becomes what nudge_cancel is since version 2: a
--    SECURITY DEFINER wrapper that checks the tenant first, around the
--    version-1 body kept as nudge_reschedule_unchecked (which nobody but the
--    owner may call). Before this, it ran with the caller's rights and was
--    executable by PUBLIC: the intake role could not use it (no UPDATE on
--    reminders), and granting that would have let one tenant move another's
--    reminders.

CREATE OR REPLACE FUNCTION nudge_invalid(
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
            THEN ARRAY['data', 'must be at most 65536 bytes as JSON, got ' || octet_length(p_data::text)]
        WHEN p_due_at IS NULL THEN ARRAY['due_at', 'is required (RFC 3339 time)']
        WHEN p_deadline IS NULL THEN ARRAY['deadline', 'is required (RFC 3339 time)']
        WHEN p_deadline <= p_due_at THEN ARRAY['deadline', 'must be after due_at']
    END
$$;

ALTER FUNCTION nudge_reschedule(text, text, timestamptz, timestamptz, text, text)
    RENAME TO nudge_reschedule_unchecked;

-- nudge_reschedule as in version 1, for a tenant the session may act for
-- (else it raises 42501, whether or not the key exists).
CREATE FUNCTION nudge_reschedule(p_tenant text, p_key text, p_due_at timestamptz, p_deadline timestamptz,
                                 p_actor text DEFAULT 'intake', p_reason text DEFAULT 'rescheduled by application')
RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    RETURN nudge_reschedule_unchecked(p_tenant, p_key, p_due_at, p_deadline, p_actor, p_reason);
END $$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION nudge_reschedule(text, text, timestamptz, timestamptz, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
END $$;

REVOKE EXECUTE ON FUNCTION
    nudge_reschedule_unchecked(text, text, timestamptz, timestamptz, text, text),
    nudge_reschedule(text, text, timestamptz, timestamptz, text, text)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION nudge_reschedule(text, text, timestamptz, timestamptz, text, text)
  TO nudge_intake, nudge_operator;
