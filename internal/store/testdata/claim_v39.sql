-- ClaimDue as schema versions 32–39 ran it (verbatim from internal/store/queries.sql
-- at 032cd5b): its probes test the state with the plain "s.state = 'pending'",
-- which proves the predicate of every partial index holding pending rows.
-- BenchmarkClaimPlan runs it beside today's, on the same tables.

-- name: ClaimDue
-- pending rows due before the run's fixed cutoff become enqueued under a new
-- fence, a dispatch lease and the claim's batch number (the dispatcher then
-- publishes them and records one confirmation for the batch: see
-- ConfirmPublished and ResolveExpiredLeases); those already past their
-- deadline become expired instead. A batch
-- takes an even part from every tenant with due rows (round robin, each
-- tenant's in due order), so a tenant's large backlog is published
-- interleaved with the other tenants' reminders, not ahead of them. The
-- tenants are found by a skip scan of reminder_state_pending_tenant: one
-- index probe per tenant with pending rows. It reads no wide row (the zone
-- and own window are on the state row) and returns no idempotency key: the
-- dispatcher's message carries the id and fence, and the worker takes the
-- key from the row its claim reads (ClaimForDelivery, LoadForDelivery).
WITH RECURSIVE tenants(tenant) AS (
    (SELECT s.tenant FROM reminder_state s WHERE s.state = 'pending' ORDER BY s.tenant LIMIT 1)
  UNION ALL
    SELECT (SELECT s.tenant FROM reminder_state s
             WHERE s.state = 'pending' AND s.tenant > t.tenant ORDER BY s.tenant LIMIT 1)
      FROM tenants t
     WHERE t.tenant IS NOT NULL
), due_tenants AS (
    SELECT t.tenant FROM tenants t
     WHERE t.tenant IS NOT NULL
       -- the tenant's earliest pending row, one probe of reminder_state_pending_tenant
       AND (SELECT s.due_at FROM reminder_state s
             WHERE s.state = 'pending' AND s.tenant = t.tenant
             ORDER BY s.due_at LIMIT 1) <= @cutoff
), quota AS (
    SELECT greatest(1, ceil(@limit::float8 / count(*)))::bigint AS n FROM due_tenants
), picks AS (
    SELECT p.id, p.due_at, p.turn
      FROM due_tenants t
     CROSS JOIN LATERAL (
           SELECT s.id, s.due_at, row_number() OVER (ORDER BY s.due_at, s.id) AS turn
             FROM reminder_state s
            WHERE s.state = 'pending' AND s.tenant = t.tenant AND s.due_at <= @cutoff
            ORDER BY s.due_at, s.id
            LIMIT (SELECT n FROM quota)) p
), due AS (
    -- The picked rows, locked, with what judging them needs (read here, not
    -- looked up again per row), and their own window as keys that = can
    -- join on (NULL never equals; the CHECK reminders_window keeps an own
    -- window's open below 24:00, its close from 00:00 and its days from -1,
    -- and the state row holds the wide row's copy). Looked up by primary
    -- key from an array of the picks: from "id IN (SELECT ...)" the planner
    -- hashes the picks and scans the whole narrow table once it has
    -- statistics (all 19,500 rows of a 20,000-row table, 4 ms, for 500).
    SELECT s.id, s.state AS old_state, s.tenant, s.channel, s.deadline, coalesce(s.tz, 'UTC') AS tz,
           s.window_open, s.window_close, s.window_days, s.claimed_at IS NULL AS claim_slot_empty,
           coalesce(s.window_open, time '24:00') AS own_open, coalesce(s.window_close, time '00:00') AS own_close,
           coalesce(s.window_days, -1) AS own_days
      FROM reminder_state s
     WHERE s.id = ANY(ARRAY(SELECT id FROM picks ORDER BY turn, due_at, id LIMIT @limit))
       AND (s.state = 'pending') IS TRUE AND s.due_at <= @cutoff
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
    SELECT d.id, d.old_state, d.claim_slot_empty, d.deadline, d.tz, p.window_open, p.window_close, p.window_days,
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
    SELECT p.id, p.old_state, p.claim_slot_empty,
           CASE WHEN p.deadline <= @now THEN 'deadline'
                WHEN o.opens_at = @now THEN 'open'
                WHEN o.opens_at < p.deadline THEN 'closed'
                ELSE 'no_window' END AS verdict,
           o.opens_at
      FROM windowed p
      JOIN openings o ON o.zone = p.zone AND o.open_key = p.open_key AND o.window_close = p.window_close
                     AND o.window_days = p.window_days
), folds AS (
    -- A claim goes into the row's claimed slot when that is empty (the
    -- reminder's first claim by this version), else into an event.
    SELECT j.*, j.verdict = 'open' AND j.claim_slot_empty AS fold FROM judged j
), batch AS (
    SELECT nextval('dispatch_batches') AS id
), claimed AS (
    -- open: enqueued; closed: stays pending, due at the opening (the due
    -- time asked for is kept in requested_due_at), under the same fence;
    -- deadline passed, or no opening before it: expired.
    UPDATE reminder_state s
       SET state          = CASE j.verdict WHEN 'open' THEN 'enqueued' WHEN 'closed' THEN 'pending' ELSE 'expired' END,
           fence          = CASE WHEN j.verdict = 'closed' THEN s.fence ELSE s.fence + 1 END,
           lease_until    = CASE WHEN j.verdict = 'open' THEN @lease_until::timestamptz END,
           enqueued_at    = CASE WHEN j.verdict = 'open' THEN @now::timestamptz ELSE s.enqueued_at END,
           dispatch_batch = CASE WHEN j.verdict = 'open' THEN batch.id ELSE s.dispatch_batch END,
           due_at         = CASE WHEN j.verdict = 'closed' THEN j.opens_at ELSE s.due_at END,
           requested_due_at = CASE WHEN j.verdict = 'closed' THEN coalesce(s.requested_due_at, s.due_at)
                                   ELSE s.requested_due_at END,
           reason         = CASE j.verdict
                                WHEN 'deadline' THEN 'deadline passed before dispatch'
                                WHEN 'no_window' THEN 'no send window opens before the deadline'
                                WHEN 'closed' THEN 'send window closed; due again at its next opening'
                                ELSE s.reason END,
           finished_at    = CASE WHEN j.verdict IN ('deadline', 'no_window') THEN @now::timestamptz END,
           claimed_at     = CASE WHEN j.fold THEN @now::timestamptz ELSE s.claimed_at END,
           claimed_fence  = CASE WHEN j.fold THEN s.fence + 1 ELSE s.claimed_fence END,
           claimed_by     = CASE WHEN j.fold THEN @actor::text ELSE s.claimed_by END,
           updated_at     = @now
      FROM folds j, batch
     WHERE s.id = j.id
 RETURNING s.id, j.old_state, s.state, s.fence, s.channel, s.tenant, s.deadline, s.attempts,
           s.due_at, s.dispatch_batch, s.reason, j.verdict, j.fold
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, state, fence, @actor,
           CASE verdict WHEN 'deadline' THEN 'deadline_before_dispatch' WHEN 'no_window' THEN 'no_window_before_deadline'
                        WHEN 'closed' THEN 'window_closed' ELSE 'claimed' END,
           CASE verdict WHEN 'open' THEN 'claimed for dispatch'
                        WHEN 'closed' THEN reason || ' (' || to_char(due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ')'
                        ELSE reason END, @now
      FROM claimed
     WHERE NOT fold
)
SELECT id, state, fence, channel, tenant, deadline, attempts, due_at, dispatch_batch,
       -- more: some tenant filled its part, so due rows may be left
       EXISTS (SELECT 1 FROM picks, quota WHERE picks.turn = quota.n) AS more,
       CASE verdict WHEN 'deadline' THEN 'deadline_before_dispatch' WHEN 'no_window' THEN 'no_window_before_deadline'
                    WHEN 'closed' THEN 'window_closed' ELSE 'claimed' END AS code
  FROM claimed;

