-- Nudge schema, version 9: machine-readable codes instead of text contracts.
--
-- Until version 8 two contracts crossed layers as text: nudge_outcome_unknown
-- ran a regular expression over the worker's error text to tell whether an
-- attempt may have reached the recipient, and statistics found the newest
-- dispatch claim by its reason sentence, 'claimed for dispatch'. From this
-- version every event carries the code of its transition (the codes of
-- pkg/reminder's transition table), and every attempt the outcome the worker
-- decided (pkg/reminder's Outcome), in columns of their own.
--
-- Rolling upgrade: binaries of version 8 and earlier keep running while the
-- new ones roll out. Both columns are nullable without a default, so their
-- writes (which name neither) keep working and leave NULL: readers fall back
-- to what version 8 read for such rows (the error text, the reason text).
-- Old workers keep writing the coarse outcome column, and new ones write it
-- too, so an old nudgectl shows new attempts as before.

ALTER TABLE reminder_events ADD COLUMN code text;

-- NOT VALID: every existing row is NULL, so there is nothing to check, and
-- the constraint still holds for every row written from now on.
ALTER TABLE delivery_attempts ADD COLUMN result text;
ALTER TABLE delivery_attempts ADD CONSTRAINT delivery_attempts_result_check
    CHECK (result IN ('delivered', 'retryable', 'unknown', 'not_sent', 'permanent', 'panicked')) NOT VALID;

-- Whether an earlier attempt of the reminder (other than except_attempt) may
-- have reached the recipient without Nudge knowing: its worker died before
-- recording an outcome, or the worker recorded that no answer came (result
-- 'unknown'). An attempt recorded by a worker of version 8 or earlier has no
-- result: its error text is read as version 8 did (drop that branch once no
-- such worker runs and their attempts have passed the payload window).
CREATE OR REPLACE FUNCTION nudge_outcome_unknown(p_reminder_id bigint, p_except_attempt bigint DEFAULT 0)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM delivery_attempts a
                    WHERE a.reminder_id = p_reminder_id AND a.id <> p_except_attempt
                      AND (a.outcome IS NULL
                        OR a.result = 'unknown'
                        OR (a.result IS NULL AND a.outcome = 'retryable'
                            AND a.error ~ '\((timeout|network|unknown|canceled)\)')))
$$;

-- The intake functions of versions 1 and 2, unchanged but for the code of
-- the event they append.
CREATE OR REPLACE FUNCTION nudge_try_schedule_unchecked(
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
        INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
        VALUES (id, NULL, 'pending', 0, p_actor, 'scheduled', 'scheduled', now());
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

CREATE OR REPLACE FUNCTION nudge_cancel_unchecked(p_tenant text, p_key text, p_actor text DEFAULT 'intake',
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
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    VALUES (r.id, r.state, 'canceled', r.fence + 1, p_actor, 'canceled', p_reason, now());
    RETURN 'canceled';
END $$;

CREATE OR REPLACE FUNCTION nudge_reschedule(p_tenant text, p_key text, p_due_at timestamptz, p_deadline timestamptz,
                                            p_actor text DEFAULT 'intake',
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
           due_at = p_due_at, deadline = p_deadline, reason = NULL, updated_at = now()
     WHERE id = r.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    VALUES (r.id, r.state, 'pending', r.fence + 1, p_actor, 'rescheduled', p_reason, now());
    RETURN 'pending';
END $$;

-- Privileges, in the style of version 2 (column by column, per component):
-- every writer of events writes their code; the worker records attempt
-- results; nudge_outcome_unknown, run by the worker and the reconciler, reads
-- them.
GRANT INSERT (code) ON reminder_events TO nudge_dispatcher, nudge_worker, nudge_reconciler, nudge_operator;
GRANT UPDATE (result) ON delivery_attempts TO nudge_worker;
GRANT SELECT (result) ON delivery_attempts TO nudge_worker, nudge_reconciler;
