-- The statements pkg/intake runs. Each one that writes reminders makes only
-- the transitions pkg/reminder's table lists (schema/transitions_test.go runs
-- them from every state).

-- name: ScheduleMany
-- Schedules a whole batch in one statement, set-based: the same validation
-- (nudge_invalid) and the same idempotency rule as nudge_try_schedule, which
-- a web tier calls for one reminder. Within a batch the first valid
-- occurrence of a key is the one created; later ones are compared with it.
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
), resolved AS (
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
    INSERT INTO reminders AS t (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key,
                                tz, window_open, window_close, window_days)
    SELECT tenant, key, channel, recipient, template, data, due_at, deadline, nudge_idempotency_key(tenant, key),
           tz, window_open, window_close, window_days
      FROM ranked
     WHERE invalid IS NULL AND ord = first_ord
     ORDER BY ord
        ON CONFLICT ON CONSTRAINT reminders_logical_key DO NOTHING
    RETURNING t.id, t.tenant, t.key, t.channel, t.recipient, t.template, t.data, t.due_at, t.deadline, t.tz,
              t.window_open, t.window_close, t.window_days
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, NULL, 'pending', 0, $9, 'scheduled', 'scheduled', now() FROM ins
)
-- The content compared: what intake asked for (a due time the dispatcher
-- moved to a send window's opening compares as requested), and the zone
-- (absent is UTC) and the window.
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
  LEFT JOIN LATERAL (SELECT * FROM reminders r
                      WHERE i.invalid IS NULL AND n.id IS NULL AND r.tenant = i.tenant AND r.key = i.key
                     OFFSET 0) o ON true
 ORDER BY i.ord;

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
-- sees the rows: the open ones it would cancel and the sending ones. Found
-- as nudge_cancel_prefix finds them (schema version 27): the waiting rows by
-- key prefix (reminders_waiting_keys), the enqueued and sending ones among
-- the work in flight (reminders_enqueued, reminders_leases; "IS TRUE": by
-- no index of the tenant's keys).
SELECT count(*) FILTER (WHERE state <> 'sending'), count(*) FILTER (WHERE state = 'sending')
  FROM (SELECT state FROM reminders
         WHERE tenant = $1 AND key LIKE nudge_key_prefix_pattern($2)
           AND state IN ('pending', 'leased', 'retrying', 'quarantined')
        UNION ALL
        SELECT state FROM reminders
         WHERE state = 'enqueued' AND (tenant = $1 AND key LIKE nudge_key_prefix_pattern($2)) IS TRUE
        UNION ALL
        SELECT state FROM reminders
         WHERE state = 'sending' AND lease_until IS NOT NULL
           AND (tenant = $1 AND key LIKE nudge_key_prefix_pattern($2)) IS TRUE) o;

-- name: RescheduleWindow
SELECT id, key, status, state FROM nudge_reschedule_window($1, $2, $3, $4, $5::time, $6::time, $7, $8, $9);
