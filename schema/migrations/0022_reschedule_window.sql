-- Schema version 22: reschedule with a new send window (issue 14).
--
-- nudge_reschedule_to (version 14) moves a reminder to new due and deadline
-- times and keeps its window. nudge_reschedule_window does the same and
-- also sets the reminder's own send window in the recipient's zone
-- (version 13's window_open, window_close, window_days; a NULL close clears
-- it, so the tenant's policy for the channel applies again). Same tenant
-- check, same answers (a nudge_change row: changed, unchanged, not_found,
-- terminal, sending), same event code (rescheduled) as nudge_reschedule_to.
CREATE FUNCTION nudge_reschedule_window(p_tenant text, p_key text, p_due_at timestamptz, p_deadline timestamptz,
                                        p_window_open time, p_window_close time, p_window_days integer,
                                        p_actor text DEFAULT 'intake',
                                        p_reason text DEFAULT 'rescheduled by application')
RETURNS nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    r       reminders%ROWTYPE;
    w       record;
    invalid text[];
    refused text;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    SELECT * INTO r FROM reminders WHERE tenant = p_tenant AND key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        RETURN ROW(NULL, p_key, 'not_found', NULL)::nudge_change;
    END IF;
    invalid := coalesce(
        nudge_invalid_local(NULL, p_due_at, NULL, p_deadline, NULL, p_window_open, p_window_close, p_window_days),
        nudge_invalid(r.tenant, r.key, r.channel, r.recipient, r.template, r.data, p_due_at, p_deadline));
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'nudge: field "%" %', invalid[1], invalid[2] USING ERRCODE = '22023', COLUMN = invalid[1];
    END IF;
    refused := nudge_change_refused(r.state);
    IF refused IS NOT NULL THEN
        RETURN ROW(r.id, r.key, refused, r.state)::nudge_change;
    END IF;
    SELECT * INTO w FROM nudge_window_stored(p_window_open, p_window_close, p_window_days);
    IF coalesce(r.requested_due_at, r.due_at) = p_due_at AND r.deadline = p_deadline
       AND r.window_open IS NOT DISTINCT FROM w.window_open
       AND r.window_close IS NOT DISTINCT FROM w.window_close
       AND r.window_days IS NOT DISTINCT FROM w.window_days THEN
        RETURN ROW(r.id, r.key, 'unchanged', r.state)::nudge_change;
    END IF;
    UPDATE reminders
       SET state = 'pending', fence = fence + 1, lease_until = NULL, next_attempt_at = NULL,
           due_at = p_due_at, requested_due_at = NULL, deadline = p_deadline,
           window_open = w.window_open, window_close = w.window_close, window_days = w.window_days,
           reason = NULL, updated_at = now()
     WHERE id = r.id;
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    VALUES (r.id, r.state, 'pending', r.fence + 1, p_actor, 'rescheduled', p_reason, now());
    RETURN ROW(r.id, r.key, 'changed', 'pending')::nudge_change;
END $$;

-- nudge_reschedule_to is now nudge_reschedule_window with the window the
-- reminder has: one body for both (the answers, checks and event are the
-- same; a NOT FOUND key reads NULLs and is answered not_found).
CREATE OR REPLACE FUNCTION nudge_reschedule_to(p_tenant text, p_key text, p_due_at timestamptz, p_deadline timestamptz,
                                               p_actor text DEFAULT 'intake',
                                               p_reason text DEFAULT 'rescheduled by application')
RETURNS nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    w record;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    SELECT window_open, window_close, window_days INTO w FROM reminders WHERE tenant = p_tenant AND key = p_key;
    RETURN nudge_reschedule_window(p_tenant, p_key, p_due_at, p_deadline,
                                   w.window_open, w.window_close, w.window_days, p_actor, p_reason);
END $$;

DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'nudge_reschedule_window(text, text, timestamptz, timestamptz, time, time, integer, text, text)',
        'nudge_reschedule_to(text, text, timestamptz, timestamptz, text, text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END $$;

REVOKE EXECUTE ON FUNCTION
    nudge_reschedule_window(text, text, timestamptz, timestamptz, time, time, integer, text, text)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    nudge_reschedule_window(text, text, timestamptz, timestamptz, time, time, integer, text, text)
  TO nudge_intake, nudge_operator;
