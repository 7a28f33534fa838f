-- Schema version 50: many reminders in one call from SQL, at the bulk
-- statement's cost (issue 18).
--
-- The set-based intake statement (each table written once for a whole batch:
-- pkg/intake's ScheduleMany) was pkg/intake's own text, run with the caller's
-- table privileges. So a web tier in another language, or a Go one under the
-- least-privileged nudge_intake login, had only nudge_schedule, once per
-- reminder, at about three times the statement's CPU per reminder: each call
-- runs its own INSERT statements, and PostgreSQL pays per statement what the
-- batch pays once (docs/benchmarks.md, "The function path's bar"). A
-- prototype of this function measured the statement's own cost.
--
-- So the statement is here too, for SQL callers:
--
-- - nudge_schedule_many_unchecked runs it with the invoker's rights, for no
--   one but the owner (the wrapper below);
-- - nudge_schedule_many is the entry point, SECURITY DEFINER as
--   nudge_schedule: every tenant of the batch is checked first (42501 for
--   the whole call, nothing written, as nudge_schedule refuses one), the
--   arrays must have one element per reminder (the optional ones may be
--   NULL), at most 10,000 reminders a call. p_actor is the author of the
--   "scheduled" events, as nudge_try_schedule's.
--
-- pkg/intake keeps its own copy of the statement for this release: a
-- migration numbered after after-rollout ones still pending waits for them
-- (nudgectl migrate), so this release's binaries and applications must not
-- need it. TestScheduleManyIsPkgIntakesStatement (schema) fails when the
-- two differ; a later release moves pkg/intake onto this function and drops
-- its copy.
--
-- One row per reminder, in order (ord, from 1): the reminder's id, its status
-- (created; exists: the same content was scheduled before, or earlier in the
-- batch; conflict: the key is taken with other content; invalid: field and
-- reason say why; concurrent: another transaction is scheduling the key),
-- and for an invalid one the field and the reason. Invalid or conflicting
-- reminders do not stop the others.

CREATE FUNCTION nudge_schedule_many_unchecked(
    p_tenants text[], p_keys text[], p_channels text[], p_recipients text[], p_templates text[],
    p_data text[], p_due_at timestamptz[], p_deadlines timestamptz[], p_actor text,
    p_tz text[], p_due_local timestamp[], p_deadline_local timestamp[],
    p_window_open time[], p_window_close time[], p_window_days integer[])
RETURNS TABLE (id bigint, status text, field text, reason text)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
BEGIN
    -- pkg/intake's ScheduleMany (pkg/intake/queries.sql, which explains
    -- it), its parameters named: TestScheduleManyIsPkgIntakesStatement.
    RETURN QUERY
    WITH raw AS MATERIALIZED (
        -- Materialized so data is parsed once and nudge_invalid, taking plain
        -- columns, is inlined into the statement. Local wall times are resolved
        -- in the zone (nudge_resolve_local) only when its arguments are valid:
        -- an unknown zone would fail the whole statement.
        SELECT u.tenant, u.key, u.channel, u.recipient, u.template, u.data::jsonb AS data,
               u.due_at, u.deadline, u.ord, u.tz, u.due_local, u.deadline_local, u.w_open, u.w_close, u.w_days,
               nudge_invalid_local(u.tz, u.due_at, u.due_local, u.deadline, u.deadline_local,
                                   u.w_open, u.w_close, u.w_days) AS invalid_local
          FROM unnest(p_tenants::text[], p_keys::text[], p_channels::text[], p_recipients::text[], p_templates::text[], p_data::text[],
                      p_due_at::timestamptz[], p_deadlines::timestamptz[], p_tz::text[], p_due_local::timestamp[], p_deadline_local::timestamp[],
                      p_window_open::time[], p_window_close::time[], p_window_days::integer[])
               WITH ORDINALITY AS u(tenant, key, channel, recipient, template, data, due_at, deadline,
                                    tz, due_local, deadline_local, w_open, w_close, w_days, ord)
    ), resolved AS MATERIALIZED (
        -- Materialized so input's nudge_invalid gets the resolved due time and
        -- deadline as plain columns: pulled up into it, they are this CASE with
        -- a function call, which the planner will not copy into the places the
        -- function's body reads them, so it ran nudge_invalid through the SQL
        -- function executor, an executor start per row (half of the statement's
        -- CPU: TestBulkIntakeInlinesValidation).
        SELECT raw.tenant, raw.key, raw.channel, raw.recipient, raw.template, raw.data, raw.ord, raw.tz,
               raw.invalid_local,
               CASE WHEN raw.invalid_local IS NULL
                    THEN coalesce(raw.due_at, nudge_resolve_local(raw.due_local, raw.tz)) END AS due_at,
               CASE WHEN raw.invalid_local IS NULL
                    THEN coalesce(raw.deadline, nudge_resolve_local(raw.deadline_local, raw.tz)) END AS deadline,
               w.window_open, w.window_close, w.window_days
          FROM raw, nudge_window_stored(raw.w_open, raw.w_close, raw.w_days) w
    ), input AS (
        SELECT resolved.*,
               coalesce(invalid_local,
                        nudge_invalid(tenant, key, channel, recipient, template, data, due_at, deadline)) AS invalid
          FROM resolved
    ), ranked AS (
        SELECT input.*, min(ord) FILTER (WHERE invalid IS NULL) OVER (PARTITION BY tenant, key) AS first_ord
          FROM input
    ), ins AS (
        -- lazy (schema 38): with lazy intake on (nudge_lazy_intake's horizon,
        -- NULL is off), a reminder due at least the horizon after
        -- clock_timestamp() gets no state row here; the promoter inserts it
        -- before it is due. The clock is read inside this INSERT, after its lock
        -- on reminders: the promoter's race argument (internal/store Promote).
        INSERT INTO reminders AS t (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key,
                                    tz, window_open, window_close, window_days, lazy)
        SELECT tenant, key, channel, recipient, template, data, due_at, deadline, nudge_idempotency_key(tenant, key),
               tz, window_open, window_close, window_days,
               coalesce(due_at >= clock_timestamp() + (SELECT l.horizon FROM nudge_lazy_intake l), false)
          FROM ranked
         WHERE invalid IS NULL AND ord = first_ord
         ORDER BY ord
            ON CONFLICT ON CONSTRAINT reminders_logical_key DO NOTHING
        RETURNING t.id, t.tenant, t.key, t.channel, t.recipient, t.template, t.data, t.due_at, t.deadline, t.tz,
                  t.window_open, t.window_close, t.window_days, t.lazy
    ), state AS (
        INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days)
        SELECT id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days
          FROM ins WHERE NOT lazy ORDER BY id
            ON CONFLICT (id) DO NOTHING
    ), events AS (
        INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
        SELECT id, NULL, 'pending', 0, p_actor, 'scheduled', 'scheduled', now() FROM ins
    )
    -- The content compared: what intake asked for (a due time the dispatcher
    -- moved to a send window's opening compares as requested), and the zone
    -- (absent is UTC) and the window. An existing reminder without its state
    -- row yet (due far ahead: the promoter inserts it, schema 39) compares with
    -- its wide row's intent as recorded.
    SELECT coalesce(n.id, o.id),
           CASE
               WHEN i.invalid IS NOT NULL THEN 'invalid'
               WHEN n.id IS NOT NULL AND i.ord = i.first_ord THEN 'created'
               WHEN n.id IS NULL AND o.id IS NULL THEN 'concurrent'
               WHEN (i.channel, i.recipient, i.template, i.data, i.due_at, i.deadline, coalesce(i.tz, 'UTC'),
                     i.window_open, i.window_close, i.window_days)
                    IS NOT DISTINCT FROM
                    (coalesce(n.channel, o.channel), coalesce(n.recipient, o.recipient),
                     coalesce(n.template, o.template), coalesce(n.data, o.data),
                     coalesce(n.due_at, o.requested_due_at, o.due_at), coalesce(n.deadline, o.deadline),
                     coalesce(n.tz, o.tz, 'UTC'),
                     CASE WHEN n.id IS NOT NULL THEN n.window_open ELSE o.window_open END,
                     CASE WHEN n.id IS NOT NULL THEN n.window_close ELSE o.window_close END,
                     CASE WHEN n.id IS NOT NULL THEN n.window_days ELSE o.window_days END) THEN 'exists'
               ELSE 'conflict'
           END,
           i.invalid[1], i.invalid[2]
      FROM ranked i
      LEFT JOIN ins n ON i.invalid IS NULL AND n.tenant = i.tenant AND n.key = i.key
      LEFT JOIN LATERAL (SELECT r.id, r.channel, r.recipient, r.template, r.data, s.requested_due_at,
                                coalesce(s.due_at, r.due_at) AS due_at, coalesce(s.deadline, r.deadline) AS deadline,
                                CASE WHEN s.id IS NULL THEN r.tz ELSE s.tz END AS tz,
                                CASE WHEN s.id IS NULL THEN r.window_open ELSE s.window_open END AS window_open,
                                CASE WHEN s.id IS NULL THEN r.window_close ELSE s.window_close END AS window_close,
                                CASE WHEN s.id IS NULL THEN r.window_days ELSE s.window_days END AS window_days
                           FROM reminders r
                           LEFT JOIN reminder_state s ON s.id = r.id
                          WHERE i.invalid IS NULL AND n.id IS NULL AND r.tenant = i.tenant AND r.key = i.key
                         OFFSET 0) o ON true
     ORDER BY i.ord;
END $fn$;

CREATE FUNCTION nudge_schedule_many(
    p_tenants text[], p_keys text[], p_channels text[], p_recipients text[], p_templates text[],
    p_data jsonb[], p_due_at timestamptz[], p_deadlines timestamptz[],
    p_tz text[] DEFAULT NULL, p_due_local timestamp[] DEFAULT NULL, p_deadline_local timestamp[] DEFAULT NULL,
    p_window_open time[] DEFAULT NULL, p_window_close time[] DEFAULT NULL, p_window_days integer[] DEFAULT NULL,
    p_actor text DEFAULT 'intake')
RETURNS TABLE (ord integer, id bigint, status text, field text, reason text)
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
#variable_conflict use_column
DECLARE
    n      integer := coalesce(cardinality(p_keys), 0);
    arg    record;
    tenant text;
BEGIN
    IF n > 10000 THEN
        RAISE EXCEPTION 'nudge: at most 10000 reminders a call, got %', n
            USING ERRCODE = '22023', HINT = 'split the batch';
    END IF;
    FOR arg IN SELECT * FROM (VALUES
            ('p_tenants', cardinality(p_tenants), true), ('p_channels', cardinality(p_channels), true),
            ('p_recipients', cardinality(p_recipients), true), ('p_templates', cardinality(p_templates), true),
            ('p_data', cardinality(p_data), true), ('p_due_at', cardinality(p_due_at), false),
            ('p_deadlines', cardinality(p_deadlines), false), ('p_tz', cardinality(p_tz), false),
            ('p_due_local', cardinality(p_due_local), false),
            ('p_deadline_local', cardinality(p_deadline_local), false),
            ('p_window_open', cardinality(p_window_open), false),
            ('p_window_close', cardinality(p_window_close), false),
            ('p_window_days', cardinality(p_window_days), false)) AS a(name, len, required)
    LOOP
        IF (arg.len IS NULL AND arg.required) OR arg.len <> n THEN
            RAISE EXCEPTION 'nudge: % has % elements, p_keys has %: give one per reminder%', arg.name,
                coalesce(arg.len::text, 'no'), n, CASE WHEN arg.required THEN '' ELSE ' (or NULL for none)' END
                USING ERRCODE = '22023', COLUMN = arg.name;
        END IF;
    END LOOP;
    FOR tenant IN SELECT DISTINCT t FROM unnest(p_tenants) AS t WHERE nullif(btrim(t), '') IS NOT NULL LOOP
        IF NOT nudge_tenant_allowed(tenant) THEN
            PERFORM nudge_check_tenant(tenant); -- raises the refusal
        END IF;
    END LOOP;
    RETURN QUERY
    SELECT (row_number() OVER ())::integer, u.id, u.status, u.field, u.reason
      FROM nudge_schedule_many_unchecked(p_tenants, p_keys, p_channels, p_recipients, p_templates,
                                         p_data::text[], p_due_at, p_deadlines, coalesce(p_actor, 'intake'),
                                         p_tz, p_due_local, p_deadline_local,
                                         p_window_open, p_window_close, p_window_days) AS u;
END $fn$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION nudge_schedule_many(text[], text[], text[], text[], text[], jsonb[], '
                   'timestamptz[], timestamptz[], text[], timestamp[], timestamp[], time[], time[], integer[], text) '
                   'SET search_path = %I, pg_temp', current_schema());
END $$;

REVOKE ALL ON FUNCTION
    nudge_schedule_many_unchecked(text[], text[], text[], text[], text[], text[], timestamptz[], timestamptz[],
                                  text, text[], timestamp[], timestamp[], time[], time[], integer[]),
    nudge_schedule_many(text[], text[], text[], text[], text[], jsonb[], timestamptz[], timestamptz[],
                        text[], timestamp[], timestamp[], time[], time[], integer[], text)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    nudge_schedule_many(text[], text[], text[], text[], text[], jsonb[], timestamptz[], timestamptz[],
                        text[], timestamp[], timestamp[], time[], time[], integer[], text)
  TO nudge_intake, nudge_operator, nudge_planner;
