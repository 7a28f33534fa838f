-- The statements pkg/intake runs. Each one that writes reminders makes only
-- the transitions pkg/reminder's table lists (schema/transitions_test.go runs
-- them from every state).
--
-- State lives on reminder_state (schema 32, alias s): every state column is
-- read there, and the wide reminders row (r) is read for what only it has
-- (key, recipient, template, data, idempotency key, created_at), found by
-- its primary key or its logical key (tenant, key).

-- name: ScheduleMany
-- Schedules a whole batch in one statement, set-based: the same validation
-- (nudge_invalid) and the same idempotency rule as nudge_try_schedule, which
-- a web tier calls for one reminder. Within a batch the first valid
-- occurrence of a key is the one created; later ones are compared with it.
-- Each created reminder's state row is inserted here too (state: its
-- CTE): this release's forward mirror (0032) would make it at the
-- statement's end and then finds it made; the release that drops the mirror
-- relies on this statement alone.
WITH raw AS MATERIALIZED (
    -- Materialized so data is parsed once and nudge_invalid, taking plain
    -- columns, is inlined into the statement. Local wall times are resolved
    -- in the zone (nudge_resolve_local) only when its arguments are valid:
    -- an unknown zone would fail the whole statement.
    SELECT u.tenant, u.key, u.channel, u.recipient, u.template, u.data::jsonb AS data,
           u.due_at, u.deadline, u.ord, u.tz, u.due_local, u.deadline_local, u.w_open, u.w_close, u.w_days,
           nudge_invalid_local(u.tz, u.due_at, u.due_local, u.deadline, u.deadline_local,
                               u.w_open, u.w_close, u.w_days) AS invalid_local
      FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                  $7::timestamptz[], $8::timestamptz[], $10::text[], $11::timestamp[], $12::timestamp[],
                  $13::time[], $14::time[], $15::integer[])
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
    SELECT id, NULL, 'pending', 0, $9, 'scheduled', 'scheduled', now() FROM ins
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

-- name: TrySchedule
-- One reminder, as a web tier schedules it (Schedule): nudge_try_schedule
-- checks the tenant (SECURITY DEFINER) and runs the body every intake
-- function shares (nudge_try_schedule_unchecked), actor "intake".
SELECT id, status, field, reason
  FROM nudge_try_schedule($1, $2, $3, $4, $5, $6::jsonb, $7, $8, 'intake',
                          $9, $10::timestamp, $11::timestamp, $12::time, $13::time, $14);

-- name: Cancel
SELECT nudge_cancel($1, $2, $3, $4);

-- name: Reschedule
SELECT nudge_reschedule($1, $2, $3, $4, $5, $6);

-- name: RescheduleTo
SELECT id, key, status, state FROM nudge_reschedule_to($1, $2, $3, $4, $5, $6);

-- name: Update
SELECT id, key, status, state FROM nudge_update($1, $2, $3, $4, $5::jsonb, $6, $7);

-- name: CancelPrefix
SELECT id, key, status, state FROM nudge_cancel_prefix($1, $2, $3, $4, $5);

-- name: CountPrefix
-- What nudge_cancel_prefix would select (without its limit), as the caller
-- sees the rows: the open ones it would cancel and the sending ones. The
-- waiting rows by key prefix (the tenant's keys of the wide rows, then each
-- one's state row by primary key), the enqueued and sending ones among the
-- work in flight (reminder_state_enqueued, reminder_state_leases; then, for
-- the tenant's rows only, the wide row's key by primary key; "IS TRUE": by
-- no index of the tenant's keys). A key without a state row yet is pending.
SELECT count(*) FILTER (WHERE state <> 'sending'), count(*) FILTER (WHERE state = 'sending')
  FROM (SELECT coalesce(s.state, 'pending') AS state
          FROM reminders r
          LEFT JOIN reminder_state s ON s.id = r.id
         WHERE r.tenant = $1 AND r.key LIKE nudge_key_prefix_pattern($2)
           AND coalesce(s.state, 'pending') IN ('pending', 'leased', 'retrying', 'quarantined')
        UNION ALL
        SELECT s.state
          FROM reminder_state s
         WHERE s.state = 'enqueued'
           AND (s.tenant = $1
                AND (SELECT r.key FROM reminders r WHERE r.id = s.id) LIKE nudge_key_prefix_pattern($2)) IS TRUE
        UNION ALL
        SELECT s.state
          FROM reminder_state s
         WHERE s.state = 'sending' AND s.lease_until IS NOT NULL
           AND (s.tenant = $1
                AND (SELECT r.key FROM reminders r WHERE r.id = s.id) LIKE nudge_key_prefix_pattern($2)) IS TRUE) o;

-- name: RescheduleWindow
SELECT id, key, status, state FROM nudge_reschedule_window($1, $2, $3, $4, $5::time, $6::time, $7, $8, $9);

-- name: Get
-- A reminder by id ($1), or else by its logical key ($2, $3), in read.go's
-- scanReminder order: the wide row's key, payload and creation time, the
-- rest from its state row. Without a state row yet (due far ahead: the
-- promoter inserts it, schema 39) it is pending at fence 0 with no attempt,
-- its times, zone and window the wide row's intent as recorded, last
-- changed when created.
SELECT r.id, r.tenant, r.key, r.channel, r.recipient, r.template, r.data, coalesce(s.due_at, r.due_at),
       coalesce(s.deadline, r.deadline), r.idempotency_key, coalesce(s.state, 'pending'), coalesce(s.fence, 0),
       s.lease_until, coalesce(s.attempts, 0), s.next_attempt_at, s.enqueued_at,
       coalesce(s.last_error, ''), coalesce(s.reason, ''), r.created_at, coalesce(s.updated_at, r.created_at),
       s.finished_at, coalesce(CASE WHEN s.id IS NULL THEN r.tz ELSE s.tz END, ''), s.requested_due_at,
       (extract(epoch FROM CASE WHEN s.id IS NULL THEN r.window_open ELSE s.window_open END) / 60)::int,
       (extract(epoch FROM CASE WHEN s.id IS NULL THEN r.window_close ELSE s.window_close END) / 60)::int,
       CASE WHEN s.id IS NULL THEN r.window_days ELSE s.window_days END
  FROM reminders r
  LEFT JOIN reminder_state s ON s.id = r.id
 WHERE r.id = coalesce($1::bigint, (SELECT k.id FROM reminders k WHERE k.tenant = $2::text AND k.key = $3::text));
