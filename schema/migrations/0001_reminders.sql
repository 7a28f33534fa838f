-- Nudge schema, version 1: reminder intent, delivery attempts, the event trail,
-- and the intake functions a web tier in any language calls inside its own
-- transaction. Unqualified names: the migration lands in the first schema of
-- the connection's search_path, so one database can hold isolated installs.

CREATE TABLE reminders (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant           text        NOT NULL,
    key              text        NOT NULL,
    channel          text        NOT NULL CHECK (channel IN ('email', 'sms')),
    recipient        text        NOT NULL,
    template         text        NOT NULL,
    data             jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(data) = 'object'),
    due_at           timestamptz NOT NULL,
    deadline         timestamptz NOT NULL,
    -- Stable across every attempt and every replay: goes to the provider as
    -- its idempotency key and (email) becomes the Message-ID.
    -- Set by nudge_try_schedule from (tenant, key): see nudge_idempotency_key.
    idempotency_key  text        NOT NULL,
    state            text        NOT NULL DEFAULT 'pending' CHECK (state IN
                         ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined',
                          'delivered', 'failed', 'expired', 'canceled')),
    -- Fencing token: bumped by every claim; a write guarded by an older value
    -- is refused, so a holder whose lease was taken over cannot change the row.
    fence            bigint      NOT NULL DEFAULT 0,
    lease_until      timestamptz,
    attempts         integer     NOT NULL DEFAULT 0,
    -- How many times the reconciler republished it; past a bound it is
    -- quarantined instead (a message that crashes every consumer).
    republishes      integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    enqueued_at      timestamptz,
    last_error       text,
    reason           text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    CONSTRAINT reminders_logical_key UNIQUE (tenant, key),
    CONSTRAINT reminders_deadline_after_due CHECK (deadline > due_at)
);

-- The dispatcher's claim query walks only due, pending work: this index holds
-- pending rows alone, so it stays as small as the backlog however large the
-- table of terminal history grows.
CREATE INDEX reminders_pending_due ON reminders (due_at, id) WHERE state = 'pending';
-- The reconciler's sweeps, each over one small partial index.
CREATE INDEX reminders_leases ON reminders (lease_until) WHERE state IN ('leased', 'sending');
CREATE INDEX reminders_enqueued ON reminders (enqueued_at) WHERE state = 'enqueued';
CREATE INDEX reminders_retrying ON reminders (next_attempt_at) WHERE state = 'retrying';
CREATE INDEX reminders_open_deadline ON reminders (deadline)
    WHERE state IN ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined');

CREATE TABLE delivery_attempts (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reminder_id         bigint      NOT NULL REFERENCES reminders (id) ON DELETE CASCADE,
    attempt             integer     NOT NULL,
    fence               bigint      NOT NULL,
    worker              text        NOT NULL,
    started_at          timestamptz NOT NULL,
    finished_at         timestamptz,
    -- NULL while the send is in flight (or its worker died mid-send).
    outcome             text CHECK (outcome IN ('delivered', 'retryable', 'permanent', 'stale')),
    provider_message_id text,
    error               text
);
CREATE INDEX delivery_attempts_reminder ON delivery_attempts (reminder_id);

-- Append-only: one row per state transition, with who decided and why. No
-- foreign key: decision events are kept longer than the reminders and
-- payloads they describe (retention removes those first).
CREATE TABLE reminder_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    reminder_id bigint      NOT NULL,
    from_state  text,
    to_state    text        NOT NULL,
    fence       bigint      NOT NULL,
    actor       text        NOT NULL,
    reason      text        NOT NULL DEFAULT '',
    at          timestamptz NOT NULL
);
CREATE INDEX reminder_events_reminder ON reminder_events (reminder_id, id);

-- Whether an earlier attempt of the reminder (other than except_attempt) may
-- have reached the recipient without Nudge knowing: its worker died before
-- recording an outcome, or the provider's answer never came back (a timeout,
-- a dropped connection). A reminder that ends undelivered says so.
CREATE FUNCTION nudge_outcome_unknown(p_reminder_id bigint, p_except_attempt bigint DEFAULT 0)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM delivery_attempts a
                    WHERE a.reminder_id = p_reminder_id AND a.id <> p_except_attempt
                      AND (a.outcome IS NULL
                        OR (a.outcome = 'retryable' AND a.error ~ '\((timeout|network|unknown|canceled)\)')))
$$;

-- The idempotency key of a logical key: 'nudge-' and the hex SHA-256 of
-- tenant, newline, key (UTF-8).
CREATE FUNCTION nudge_idempotency_key(p_tenant text, p_key text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT 'nudge-' || encode(sha256(convert_to(p_tenant || E'\n' || p_key, 'UTF8')), 'hex')
$$;

-- Validates one reminder the way every intake path does. Returns NULL when it
-- is valid, else ARRAY[field, what was expected]. A single SQL expression, so
-- the bulk intake statement inlines it.
CREATE FUNCTION nudge_invalid(
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
        WHEN p_channel = 'email' AND p_recipient !~ '^[^@\s<>]+@[^@\s<>]+\.[^@\s<>]+$'
            THEN ARRAY['recipient', 'must be an email address like name@example.com']
        WHEN p_channel = 'sms' AND p_recipient !~ '^\+[1-9][0-9]{6,14}$'
            THEN ARRAY['recipient', 'must be an E.164 phone number like +14155550100']
        -- (length, not a {0,127} bound: bounded repetition costs 15 µs a row)
        WHEN p_template IS NULL OR length(p_template) > 128 OR p_template !~ '^[a-z0-9][a-z0-9._-]*$'
            THEN ARRAY['template', 'must be a template name of lowercase letters, digits, ".", "_" or "-"']
        WHEN p_data IS NULL OR jsonb_typeof(p_data) <> 'object' THEN ARRAY['data', 'must be a JSON object']
        WHEN p_due_at IS NULL THEN ARRAY['due_at', 'is required (RFC 3339 time)']
        WHEN p_deadline IS NULL THEN ARRAY['deadline', 'is required (RFC 3339 time)']
        WHEN p_deadline <= p_due_at THEN ARRAY['deadline', 'must be after due_at']
    END
$$;

-- Schedules one reminder without raising. status is 'created',
-- 'exists' (same key, same content: idempotent repeat), 'conflict' (same key,
-- different content) or 'invalid'.
CREATE FUNCTION nudge_try_schedule(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz,
    p_actor text DEFAULT 'intake',
    OUT id bigint, OUT status text, OUT field text, OUT reason text)
LANGUAGE plpgsql AS $$
DECLARE
    invalid text[];
    r       reminders%ROWTYPE;
BEGIN
    invalid := nudge_invalid(p_tenant, p_key, p_channel, p_recipient, p_template, p_data, p_due_at, p_deadline);
    IF invalid IS NOT NULL THEN
        status := 'invalid'; field := invalid[1]; reason := invalid[2];
        RETURN;
    END IF;

    INSERT INTO reminders AS t (tenant, key, channel, recipient, template, data, due_at, deadline,
                                idempotency_key)
    VALUES (p_tenant, p_key, p_channel, p_recipient, p_template, COALESCE(p_data, '{}'::jsonb),
            p_due_at, p_deadline, nudge_idempotency_key(p_tenant, p_key))
    ON CONFLICT ON CONSTRAINT reminders_logical_key DO NOTHING
    RETURNING t.id INTO id;

    IF id IS NOT NULL THEN
        INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, reason, at)
        VALUES (id, NULL, 'pending', 0, p_actor, 'scheduled', now());
        status := 'created';
        RETURN;
    END IF;

    SELECT * INTO r FROM reminders t WHERE t.tenant = p_tenant AND t.key = p_key;
    id := r.id;
    IF r.channel = p_channel AND r.recipient = p_recipient AND r.template = p_template
       AND r.data = COALESCE(p_data, '{}'::jsonb) AND r.due_at = p_due_at AND r.deadline = p_deadline THEN
        status := 'exists';
    ELSE
        status := 'conflict'; field := 'key';
        reason := format('key %L of tenant %L is already scheduled with different content', p_key, p_tenant);
    END IF;
END $$;

-- Schedules one reminder and returns its id, raising on invalid input
-- (SQLSTATE 22023, message 'nudge: field "F" R') or a key reused with other
-- content (SQLSTATE 23505). For a web tier: SELECT nudge_schedule(...) inside
-- the transaction that records the business change.
CREATE FUNCTION nudge_schedule(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    res record;
BEGIN
    SELECT * INTO res FROM nudge_try_schedule(p_tenant, p_key, p_channel, p_recipient, p_template,
                                              p_data, p_due_at, p_deadline);
    IF res.status = 'invalid' THEN
        RAISE EXCEPTION 'nudge: field "%" %', res.field, res.reason
            USING ERRCODE = '22023', COLUMN = res.field;
    ELSIF res.status = 'conflict' THEN
        RAISE EXCEPTION 'nudge: %', res.reason
            USING ERRCODE = '23505', COLUMN = 'key', CONSTRAINT = 'reminders_logical_key';
    END IF;
    RETURN res.id;
END $$;

-- Cancels a reminder that has not been sent. Returns the state it is in
-- afterwards: 'canceled', or the terminal state it already reached, or
-- 'sending' when a send is in flight (too late to stop; the outcome will be
-- recorded), or NULL when no such reminder exists.
CREATE FUNCTION nudge_cancel(p_tenant text, p_key text, p_actor text DEFAULT 'intake',
                             p_reason text DEFAULT 'canceled by application')
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r reminders%ROWTYPE;
BEGIN
    SELECT * INTO r FROM reminders WHERE tenant = p_tenant AND key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF r.state IN ('delivered', 'failed', 'expired', 'canceled', 'sending') THEN
        RETURN r.state;
    END IF;
    UPDATE reminders
       SET state = 'canceled', fence = fence + 1, lease_until = NULL, reason = p_reason,
           updated_at = now(), finished_at = now()
     WHERE id = r.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, reason, at)
    VALUES (r.id, r.state, 'canceled', r.fence + 1, p_actor, p_reason, now());
    RETURN 'canceled';
END $$;

-- Moves a reminder that has not been sent to new due and deadline times (a
-- newer version of the same intent: the course end moved, the renewal date
-- changed). It goes back to pending under a new fence, so any message already
-- queued for it is superseded. Returns the state afterwards, as nudge_cancel
-- does, or NULL when no such reminder exists.
CREATE FUNCTION nudge_reschedule(p_tenant text, p_key text, p_due_at timestamptz, p_deadline timestamptz,
                                 p_actor text DEFAULT 'intake', p_reason text DEFAULT 'rescheduled by application')
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
           due_at = p_due_at, deadline = p_deadline, reason = NULL, updated_at = now()
     WHERE id = r.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, reason, at)
    VALUES (r.id, r.state, 'pending', r.fence + 1, p_actor, p_reason, now());
    RETURN 'pending';
END $$;
