-- internal/store's statements that schema version 29 ran and version 30
-- changes (or that the rolling-upgrade tests run beside them), verbatim from
-- git show faa2730:internal/store/queries.sql: folded_test.go runs them as a
-- binary of version 29 would, beside this version's. A frozen copy, not
-- Nudge's code (schema/transitions_test.go skips testdata).

-- name: ClaimDue
-- pending rows due before the run's fixed cutoff become enqueued under a new
-- fence, a dispatch lease and the claim's batch number (the dispatcher then
-- publishes them and records one confirmation for the batch: see
-- ConfirmPublished and ResolveExpiredLeases); those already past their
-- deadline become expired instead. A batch
-- takes an even part from every tenant with due rows (round robin, each
-- tenant's in due order), so a tenant's large backlog is published
-- interleaved with the other tenants' reminders, not ahead of them. The
-- tenants are found by a skip scan of reminders_pending_tenant: one index
-- probe per tenant with pending rows.
WITH RECURSIVE tenants(tenant) AS (
    (SELECT r.tenant FROM reminders r WHERE r.state = 'pending' ORDER BY r.tenant LIMIT 1)
  UNION ALL
    SELECT (SELECT r.tenant FROM reminders r
             WHERE r.state = 'pending' AND r.tenant > t.tenant ORDER BY r.tenant LIMIT 1)
      FROM tenants t
     WHERE t.tenant IS NOT NULL
), due_tenants AS (
    SELECT t.tenant FROM tenants t
     WHERE t.tenant IS NOT NULL
       -- the tenant's earliest pending row, one probe of reminders_pending_tenant
       AND (SELECT r.due_at FROM reminders r
             WHERE r.state = 'pending' AND r.tenant = t.tenant
             ORDER BY r.due_at LIMIT 1) <= @cutoff
), quota AS (
    SELECT greatest(1, ceil(@limit::float8 / count(*)))::bigint AS n FROM due_tenants
), picks AS (
    SELECT p.id, p.due_at, p.turn
      FROM due_tenants t
     CROSS JOIN LATERAL (
           SELECT r.id, r.due_at, row_number() OVER (ORDER BY r.due_at, r.id) AS turn
             FROM reminders r
            WHERE r.state = 'pending' AND r.tenant = t.tenant AND r.due_at <= @cutoff
            ORDER BY r.due_at, r.id
            LIMIT (SELECT n FROM quota)) p
), due AS (
    -- The picked rows, locked, with what judging them needs (read here, not
    -- looked up again per row), and their own window as keys that = can
    -- join on (NULL never equals; the CHECK reminders_window keeps an own
    -- window's open below 24:00, its close from 00:00 and its days from -1).
    SELECT r.id, r.state AS old_state, r.tenant, r.channel, r.deadline, coalesce(r.tz, 'UTC') AS tz,
           r.window_open, r.window_close, r.window_days,
           coalesce(r.window_open, time '24:00') AS own_open, coalesce(r.window_close, time '00:00') AS own_close,
           coalesce(r.window_days, -1) AS own_days
      FROM reminders r
     WHERE r.id IN (SELECT id FROM picks ORDER BY turn, due_at, id LIMIT @limit)
       AND (r.state = 'pending') IS TRUE AND r.due_at <= @cutoff
       FOR UPDATE SKIP LOCKED
), policies AS MATERIALIZED (
    -- The send window that applies (nudge_send_window: the row's own, else
    -- its tenant's policy for its channel, else the default), once per
    -- distinct tenant, channel and own window of the batch, not per row.
    SELECT k.*, w.window_open, w.window_close, w.window_days
      FROM (SELECT DISTINCT tenant, channel, own_open, own_close, own_days FROM due) k
     CROSS JOIN LATERAL nudge_send_window(k.tenant, k.channel, nullif(k.own_open, time '24:00'),
                                          nullif(k.own_close, time '00:00'), nullif(k.own_days, -1)) w
), windowed AS (
    -- Each row's window, in its zone: a window that is "any time" (open
    -- NULL) is open in every zone, so its zone is left out of the key.
    SELECT d.id, d.old_state, d.deadline, d.tz, p.window_open, p.window_close, p.window_days,
           CASE WHEN p.window_open IS NULL THEN '' ELSE d.tz END AS zone,
           coalesce(p.window_open, time '24:00') AS open_key
      FROM due d
      JOIN policies p ON p.tenant = d.tenant AND p.channel = d.channel AND p.own_open = d.own_open
                     AND p.own_close = d.own_close AND p.own_days = d.own_days
), openings AS MATERIALIZED (
    -- @now when the window is open (always, for "any time"), else its next
    -- opening (docs/local-time.md): once per distinct zone and window of the
    -- batch, not per row (the window functions cost tens of microseconds a
    -- call).
    SELECT x.*, CASE WHEN x.window_open IS NULL THEN @now::timestamptz
                     ELSE nudge_next_opening(x.window_open, x.window_close, x.window_days, x.zone, @now::timestamptz)
                END AS opens_at
      FROM (SELECT DISTINCT zone, open_key, window_open, window_close, window_days FROM windowed) x
), judged AS (
    SELECT p.id, p.old_state,
           CASE WHEN p.deadline <= @now THEN 'deadline'
                WHEN o.opens_at = @now THEN 'open'
                WHEN o.opens_at < p.deadline THEN 'closed'
                ELSE 'no_window' END AS verdict,
           o.opens_at
      FROM windowed p
      JOIN openings o ON o.zone = p.zone AND o.open_key = p.open_key AND o.window_close = p.window_close
                     AND o.window_days = p.window_days
), batch AS (
    SELECT nextval('dispatch_batches') AS id
), claimed AS (
    -- open: enqueued; closed: stays pending, due at the opening (the due
    -- time asked for is kept in requested_due_at), under the same fence;
    -- deadline passed, or no opening before it: expired.
    UPDATE reminders r
       SET state          = CASE j.verdict WHEN 'open' THEN 'enqueued' WHEN 'closed' THEN 'pending' ELSE 'expired' END,
           fence          = CASE WHEN j.verdict = 'closed' THEN r.fence ELSE r.fence + 1 END,
           lease_until    = CASE WHEN j.verdict = 'open' THEN @lease_until::timestamptz END,
           enqueued_at    = CASE WHEN j.verdict = 'open' THEN @now::timestamptz ELSE r.enqueued_at END,
           dispatch_batch = CASE WHEN j.verdict = 'open' THEN batch.id ELSE r.dispatch_batch END,
           due_at         = CASE WHEN j.verdict = 'closed' THEN j.opens_at ELSE r.due_at END,
           requested_due_at = CASE WHEN j.verdict = 'closed' THEN coalesce(r.requested_due_at, r.due_at)
                                   ELSE r.requested_due_at END,
           reason         = CASE j.verdict
                                WHEN 'deadline' THEN 'deadline passed before dispatch'
                                WHEN 'no_window' THEN 'no send window opens before the deadline'
                                WHEN 'closed' THEN 'send window closed; due again at its next opening'
                                ELSE r.reason END,
           finished_at    = CASE WHEN j.verdict IN ('deadline', 'no_window') THEN @now::timestamptz END,
           updated_at     = @now
      FROM judged j, batch
     WHERE r.id = j.id
 RETURNING r.id, j.old_state, r.state, r.fence, r.channel, r.tenant, r.idempotency_key, r.deadline, r.attempts,
           r.due_at, r.dispatch_batch, r.reason, j.verdict
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, state, fence, @actor,
           CASE verdict WHEN 'deadline' THEN 'deadline_before_dispatch' WHEN 'no_window' THEN 'no_window_before_deadline'
                        WHEN 'closed' THEN 'window_closed' ELSE 'claimed' END,
           CASE verdict WHEN 'open' THEN 'claimed for dispatch'
                        WHEN 'closed' THEN reason || ' (' || to_char(due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ')'
                        ELSE reason END, @now
      FROM claimed
)
SELECT id, state, fence, channel, tenant, idempotency_key, deadline, attempts, due_at, dispatch_batch,
       -- more: some tenant filled its part, so due rows may be left
       EXISTS (SELECT 1 FROM picks, quota WHERE picks.turn = quota.n) AS more,
       CASE verdict WHEN 'deadline' THEN 'deadline_before_dispatch' WHEN 'no_window' THEN 'no_window_before_deadline'
                    WHEN 'closed' THEN 'window_closed' ELSE 'claimed' END AS code
  FROM claimed;

-- name: Reclaim
-- The reconciler's republish: rows whose message is presumed lost (enqueued or
-- retrying and overdue) or whose worker died mid-send (sending, lease expired)
-- are enqueued again under a new fence, a dispatch lease and a batch number,
-- as ClaimDue does, to be published again. Rows already past their deadline
-- are left to ExpireOverdue, and enqueued or retrying rows of the @waiting
-- channels (whose work queue has a backlog or no consumer: the message is
-- waiting, not lost) are left where they are.
WITH stuck AS (
    SELECT id, state AS old_state
      FROM reminders
     WHERE deadline > @now
       AND ((state = 'enqueued' AND enqueued_at <= @overdue_before AND NOT channel = ANY(@waiting::text[]))
         OR (state = 'retrying' AND next_attempt_at <= @overdue_before AND NOT channel = ANY(@waiting::text[]))
         OR (state = 'sending'  AND lease_until <= @now))
     ORDER BY id
     LIMIT @limit
       FOR UPDATE SKIP LOCKED
), batch AS (
    SELECT nextval('dispatch_batches') AS id
), claimed AS (
    UPDATE reminders r
       SET state = CASE WHEN r.republishes >= @max_republishes THEN 'quarantined' ELSE 'enqueued' END,
           fence = r.fence + 1, republishes = r.republishes + 1, updated_at = @now,
           lease_until = CASE WHEN r.republishes >= @max_republishes THEN NULL ELSE @lease_until::timestamptz END,
           enqueued_at = CASE WHEN r.republishes >= @max_republishes THEN r.enqueued_at ELSE @now::timestamptz END,
           dispatch_batch = CASE WHEN r.republishes >= @max_republishes THEN r.dispatch_batch ELSE batch.id END,
           reason = CASE WHEN r.republishes >= @max_republishes
                         THEN 'republished ' || r.republishes || ' times without an outcome' ELSE r.reason END
      FROM stuck, batch
     WHERE r.id = stuck.id
 RETURNING r.id, stuck.old_state, r.state, r.fence, r.channel, r.tenant, r.idempotency_key, r.deadline, r.attempts,
           r.reason, r.due_at, r.dispatch_batch
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, state, fence, @actor,
           CASE WHEN state = 'quarantined' THEN 'republish_limit'
                WHEN old_state = 'sending' THEN 'send_lease_expired'
                ELSE 'republished' END,
           CASE WHEN state = 'quarantined' THEN reason
                WHEN old_state = 'sending' THEN 'send lease expired; retrying with the same idempotency key'
                ELSE 'message overdue; republishing' END, @now
      FROM claimed
)
SELECT id, state, fence, channel, tenant, idempotency_key, deadline, attempts, due_at, dispatch_batch, old_state
  FROM claimed;

-- name: ClaimForDelivery
-- A worker's conditional write before sending: rows of the worker's channel
-- still carrying the message's fence, due and before their deadline, become
-- sending under a new fence with a send lease; each gets an attempt row. An enqueued row is
-- accepted whether or not its batch's publish confirmation is recorded yet
-- (the message in hand proves the publish; the fence proves it is the
-- current one), and so is leased (rows of an earlier version's dispatcher).
-- It also returns every named row as the statement's snapshot saw it (before
-- the claim), with the new fence, attempt number and attempt id of those it
-- claimed (NULL for the others), so a worker with nothing to decide between
-- reading and claiming (no rate limit) needs one round trip, and can tell why
-- a row was not claimed: unknown, terminal, superseded, past its deadline,
-- not yet due, retrying before its next attempt time, or moved on by a
-- concurrent writer. A row whose send window (in its zone) is closed at @now
-- is not claimed either: the worker defers or expires it (the window is
-- evaluated only for rows otherwise claimable).
WITH m AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[]) AS m(id, fence)
), named AS MATERIALIZED (
    -- Every named row as the statement's snapshot sees it (what the worker
    -- is answered), read once, with its own window as keys that = can join
    -- on (as in ClaimDue).
    SELECT r.id, r.tenant, r.channel, r.recipient, r.template, r.data, r.due_at, r.deadline, r.idempotency_key,
           r.state, r.fence, r.attempts, r.next_attempt_at, coalesce(r.tz, '') AS tz, m.fence AS want,
           coalesce(r.window_open, time '24:00') AS own_open, coalesce(r.window_close, time '00:00') AS own_close,
           coalesce(r.window_days, -1) AS own_days
      FROM m JOIN reminders r ON r.id = m.id
     WHERE r.id = ANY(@ids::bigint[]) -- by the primary key whatever the join
), policies AS MATERIALIZED (
    -- The send window that applies (nudge_send_window), once per distinct
    -- tenant, channel and own window of the batch, not per row.
    SELECT k.*, w.window_open, w.window_close, w.window_days
      FROM (SELECT DISTINCT tenant, channel, own_open, own_close, own_days FROM named) k
     CROSS JOIN LATERAL nudge_send_window(k.tenant, k.channel, nullif(k.own_open, time '24:00'),
                                          nullif(k.own_close, time '00:00'), nullif(k.own_days, -1)) w
), windowed AS (
    SELECT n.*, p.window_open, p.window_close, p.window_days
      FROM named n
      JOIN policies p ON p.tenant = n.tenant AND p.channel = n.channel AND p.own_open = n.own_open
                     AND p.own_close = n.own_close AND p.own_days = n.own_days
), cur AS (
    -- The window is evaluated only for rows otherwise claimable, and only
    -- when it is not "any time" (open NULL: open in every zone).
    SELECT w.id, w.state AS old_state, w.want AS fence
      FROM windowed w
     WHERE NOT (w.fence = w.want AND w.channel = @channel
                AND (w.state IN ('leased', 'enqueued', 'retrying')) IS TRUE
                AND w.deadline > @now AND w.due_at <= @now)
        OR w.window_open IS NULL
        OR nudge_window_open(w.window_open, w.window_close, w.window_days, coalesce(nullif(w.tz, ''), 'UTC'),
                             @now::timestamptz)
), upd AS (
    UPDATE reminders r
       SET state = 'sending', fence = r.fence + 1, attempts = r.attempts + 1,
           lease_until = @lease_until, next_attempt_at = NULL, updated_at = @now
      FROM cur
     WHERE r.id = cur.id AND r.fence = cur.fence AND r.channel = @channel
       AND (r.state IN ('leased', 'enqueued', 'retrying')) IS TRUE
       AND r.deadline > @now AND r.due_at <= @now
       AND (r.state = 'retrying' AND r.next_attempt_at > @now) IS NOT TRUE -- never before its back-off
 RETURNING r.id, cur.old_state, r.fence, r.attempts
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, 'sending', fence, @actor, 'attempt_claimed', 'attempt ' || attempts || ' claimed', @now
      FROM upd
), att AS (
    INSERT INTO delivery_attempts (reminder_id, attempt, fence, worker, started_at, provider)
    SELECT id, attempts, fence, @actor, @now, nullif(@provider::text, '') FROM upd
 RETURNING id, reminder_id
)
SELECT w.id, w.tenant, w.channel, w.recipient, w.template, w.data, w.due_at, w.deadline, w.idempotency_key,
       w.state, w.fence, w.attempts, w.next_attempt_at, w.tz,
       (extract(epoch FROM w.window_open) / 60)::int, (extract(epoch FROM w.window_close) / 60)::int, w.window_days,
       upd.fence, upd.attempts, att.id
  FROM windowed w
  LEFT JOIN upd ON upd.id = w.id
  LEFT JOIN att ON att.reminder_id = w.id;

-- name: RecordOutcomes
-- After the provider answered: each attempt row gets its outcome (@results,
-- and the coarse @outcomes that binaries before schema version 9 read)
-- whatever happened to the lease; each reminder still sending under the
-- attempt's fence moves to the state its transition's code leads to
-- (@states, derived from @codes by pkg/reminder: delivered, retrying, failed,
-- expired or quarantined).
WITH o AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[], @attempt_ids::bigint[], @states::text[],
                         @codes::text[], @results::text[], @outcomes::text[], @next_attempts::timestamptz[],
                         @errors::text[], @reasons::text[], @provider_ids::text[])
           AS o(id, fence, attempt_id, state, code, result, outcome, next_attempt_at, error, reason, provider_id)
), upd AS (
    UPDATE reminders r
       SET state = o.state, next_attempt_at = o.next_attempt_at, lease_until = NULL,
           last_error = coalesce(nullif(o.error, ''), r.last_error),
           reason = nullif(o.reason, '')
                    || CASE WHEN o.state IN ('failed', 'expired') AND nudge_outcome_unknown(r.id, o.attempt_id)
                            THEN '; an earlier attempt''s outcome is unknown' ELSE '' END,
           finished_at = CASE WHEN o.state IN ('delivered', 'failed', 'expired') THEN @now::timestamptz END,
           updated_at = @now
      FROM o
     WHERE r.id = o.id AND r.fence = o.fence AND (r.state = 'sending') IS TRUE
 RETURNING r.id, r.state, r.fence, r.reason, o.code
), att AS (
    UPDATE delivery_attempts a
       SET finished_at = @now,
           outcome = o.outcome,
           result = o.result,
           provider_message_id = nullif(o.provider_id, ''),
           error = CASE WHEN upd.id IS NULL
                        THEN concat_ws('; ', nullif(o.error, ''), 'recorded after the lease was taken over')
                        ELSE nullif(o.error, '') END
      FROM o LEFT JOIN upd ON upd.id = o.id
     WHERE a.id = o.attempt_id
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, 'sending', state, fence, @actor, code, coalesce(nullif(reason, ''), state), @now FROM upd
)
SELECT id FROM upd;

