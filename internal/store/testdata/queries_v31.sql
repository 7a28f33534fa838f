-- Every statement the dispatcher, workers and reconciler run against the
-- reminders table. Each transition is one statement that updates the rows,
-- appends their events and returns what changed, for a whole batch at once;
-- each is guarded by the fence (and the state) it expects, so a writer whose
-- lease was taken over changes nothing. Time always comes from the caller's
-- clock (@now), never from now(). Every event carries the code of its
-- transition: the moves each statement may make are listed in pkg/reminder
-- (Transitions), and schema/transitions_test.go runs every statement here from
-- every state and fails on a move, or a code, the table does not list.
--
-- The happy path's events are folded into the row (schema version 30): the
-- first claim (ClaimDue), the first attempt (ClaimForDelivery) and the
-- delivery (RecordOutcomes) write their event into slot columns of the
-- reminder they update (claimed_*, started_*, delivered_by) instead of a
-- reminder_events row, when the slot is empty; every other move appends its
-- event. Readers see both through the view reminder_timeline.
--
-- Statements that work on rows named by id test the state as
-- "(r.state ...) IS TRUE". The planner cannot prove a partial index's
-- predicate from that form, so it looks the rows up by primary key. From a
-- plain "r.state IN (...)" it proves the predicate of reminders_unsent_deadline
-- (or reminders_pending_due, reminders_leases) and, on a table without
-- statistics (just after a bulk intake), estimates a scan of that index at a
-- few rows: the scan then reads every open row to find a batch of 50 (20 ms
-- at a 20,000-row backlog, against 2 ms by key).

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
           r.window_open, r.window_close, r.window_days, r.claimed_at IS NULL AS claim_slot_empty,
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
           claimed_at     = CASE WHEN j.fold THEN @now::timestamptz ELSE r.claimed_at END,
           claimed_fence  = CASE WHEN j.fold THEN r.fence + 1 ELSE r.claimed_fence END,
           claimed_by     = CASE WHEN j.fold THEN @actor::text ELSE r.claimed_by END,
           updated_at     = @now
      FROM folds j, batch
     WHERE r.id = j.id
 RETURNING r.id, j.old_state, r.state, r.fence, r.channel, r.tenant, r.idempotency_key, r.deadline, r.attempts,
           r.due_at, r.dispatch_batch, r.reason, j.verdict, j.fold
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

-- name: ConfirmPublished
-- The broker confirmed (and routed) the messages of these claims: one row per
-- batch, not per reminder. Its rows are already enqueued; this is what tells
-- the reconciler, once their dispatch lease runs out, that they are in the
-- queue rather than lost with a dispatcher that died before its confirms.
INSERT INTO publish_confirms (batch, confirmed_at, actor, confirmed)
SELECT c.batch, @now, @actor, c.confirmed
  FROM unnest(@batches::bigint[], @confirmed::int[]) AS c(batch, confirmed);

-- name: Release
-- enqueued (or leased, from an earlier version) → pending under a new fence:
-- the publish was not confirmed. The next dispatcher run claims it again.
WITH m AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[]) AS m(id, fence)
), cur AS (
    SELECT r.id, r.state AS old_state, m.fence FROM m JOIN reminders r ON r.id = m.id
), upd AS (
    UPDATE reminders r
       SET state = 'pending', fence = r.fence + 1, lease_until = NULL, enqueued_at = NULL,
           dispatch_batch = NULL, updated_at = @now, last_error = @reason
      FROM cur
     WHERE r.id = cur.id AND r.fence = cur.fence AND (r.state IN ('leased', 'enqueued')) IS TRUE
 RETURNING r.id, cur.old_state, r.fence
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, 'pending', fence, @actor, 'publish_not_confirmed', @reason, @now FROM upd
)
SELECT id FROM upd;

-- name: ResolveExpiredLeases
-- Dispatch leases that ran out. An enqueued row whose batch has a publish
-- confirmation is in the queue: its lease is cleared and nothing else
-- changes (the overdue clock, enqueued_at, goes on). One without (its
-- dispatcher died before the confirms, or they never came), and a leased row
-- (written by an earlier version) whose holder is gone, return to pending
-- under a new fence, to be claimed and published again; a message that did
-- reach the queue is then refused by its worker for the old fence.
-- Returns how many returned to pending and how many leases were cleared.
WITH stale AS (
    SELECT r.id, r.state AS old_state, c.confirmed_at
      FROM reminders r
      LEFT JOIN publish_confirms c ON c.batch = r.dispatch_batch AND r.state = 'enqueued'
     WHERE r.state IN ('leased', 'enqueued') AND r.lease_until <= @now
     ORDER BY r.lease_until
     LIMIT @limit
       FOR UPDATE OF r SKIP LOCKED
), upd AS (
    UPDATE reminders r
       SET state          = CASE WHEN stale.confirmed_at IS NULL THEN 'pending' ELSE r.state END,
           fence          = CASE WHEN stale.confirmed_at IS NULL THEN r.fence + 1 ELSE r.fence END,
           enqueued_at    = CASE WHEN stale.confirmed_at IS NULL THEN NULL ELSE r.enqueued_at END,
           dispatch_batch = CASE WHEN stale.confirmed_at IS NULL THEN NULL ELSE r.dispatch_batch END,
           lease_until    = NULL,
           updated_at     = @now
      FROM stale
     WHERE r.id = stale.id
 RETURNING r.id, stale.old_state, r.state, r.fence
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, 'pending', fence, @actor, 'dispatch_lease_expired',
           CASE old_state WHEN 'enqueued' THEN 'dispatch lease expired before the publish was confirmed'
                          ELSE 'dispatch lease expired' END, @now
      FROM upd
     WHERE state = 'pending'
)
SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state <> 'pending') FROM upd;

-- name: ExpireOverdue
-- Every open reminder at or past its deadline ends as expired, except one
-- whose send is in flight under a live lease (its worker records the outcome),
-- and one held for a lookup: of the @hold_channels (whose provider the
-- reconciler can ask), with an attempt of unknown outcome, less than
-- @hold_for past its deadline, and not among the @looked (the provider said
-- it has nothing): UnknownAtDeadline and SettledByLookup settle those.
-- One row per channel: how many expired, and how many of them were being
-- sent under a send lease that had run out (lease expirations).
-- The rows not being sent are found by deadline (reminders_unsent_deadline),
-- the sending ones among the send leases that ran out (reminders_leases:
-- since schema version 31 no deadline index holds sending rows); each part
-- yields at most @limit, oldest deadline first, so their union holds the
-- @limit oldest. The rows are then locked by primary key, and the whole
-- test, written "(...) IS TRUE" so that it cannot pick an index, is made
-- again on the version locked.
WITH candidates AS (
    (SELECT id, deadline FROM reminders
      WHERE deadline <= @now AND state IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')
        AND NOT (channel = ANY(@hold_channels::text[]) AND deadline > @now - @hold_for::interval
                 AND id <> ALL(@looked::bigint[]) AND nudge_outcome_unknown(id))
      ORDER BY deadline
      LIMIT @limit)
    UNION ALL
    (SELECT id, deadline FROM reminders
      WHERE state = 'sending' AND lease_until <= @now AND deadline <= @now
        AND NOT (channel = ANY(@hold_channels::text[]) AND deadline > @now - @hold_for::interval
                 AND id <> ALL(@looked::bigint[]) AND nudge_outcome_unknown(id))
      ORDER BY deadline
      LIMIT @limit)
), late AS (
    SELECT r.id, r.state AS old_state
      FROM reminders r
     WHERE r.id IN (SELECT c.id FROM candidates c ORDER BY c.deadline LIMIT @limit)
       AND (r.deadline <= @now
            AND (r.state IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')
              OR (r.state = 'sending' AND r.lease_until <= @now))) IS TRUE
     ORDER BY r.deadline
     LIMIT @limit
       FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE reminders r
       SET state = 'expired', fence = r.fence + 1, lease_until = NULL, updated_at = @now,
           finished_at = @now,
           reason = CASE late.old_state
                        WHEN 'sending' THEN 'deadline passed; last send attempt outcome unknown'
                        ELSE 'deadline passed while ' || late.old_state
                             || CASE WHEN nudge_outcome_unknown(r.id) THEN '; an earlier attempt''s outcome is unknown'
                                     ELSE '' END END
      FROM late
     WHERE r.id = late.id
 RETURNING r.id, late.old_state, r.fence, r.reason, r.channel
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, 'expired', fence, @actor, 'deadline_passed', reason, @now FROM upd
)
SELECT channel, count(*), count(*) FILTER (WHERE old_state = 'sending') FROM upd GROUP BY channel;

-- name: UnknownAtDeadline
-- The reminders ExpireOverdue holds for a lookup (see there), oldest
-- deadline first, leaving out the @skip (asked about already this pass).
-- Found as ExpireOverdue finds them: the rows not being sent by deadline,
-- the sending ones among the send leases that ran out.
SELECT * FROM (
    (SELECT id, fence, state, channel, tenant, recipient, idempotency_key, deadline
       FROM reminders
      WHERE deadline <= @now AND deadline > @now - @hold_for::interval
        AND state IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')
        AND channel = ANY(@channels::text[])
        AND id <> ALL(@skip::bigint[])
        AND nudge_outcome_unknown(id)
      ORDER BY deadline
      LIMIT @limit)
    UNION ALL
    (SELECT id, fence, state, channel, tenant, recipient, idempotency_key, deadline
       FROM reminders
      WHERE state = 'sending' AND lease_until <= @now
        AND deadline <= @now AND deadline > @now - @hold_for::interval
        AND channel = ANY(@channels::text[])
        AND id <> ALL(@skip::bigint[])
        AND nudge_outcome_unknown(id)
      ORDER BY deadline
      LIMIT @limit)
) held
 ORDER BY deadline
 LIMIT @limit;

-- name: SettledByLookup
-- The reconciler asked the provider about the unknown attempts of these
-- reminders, at or past their deadline, and it holds the message: each row
-- still at its fence and where ExpireOverdue would expire it (open, or
-- sending under a send lease that ran out) is delivered, its reason saying
-- so, its event coded settled_by_lookup.
WITH m AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[], @reasons::text[]) AS m(id, fence, reason)
), cur AS (
    SELECT r.id, r.state AS old_state, m.fence, m.reason FROM m JOIN reminders r ON r.id = m.id
), upd AS (
    UPDATE reminders r
       SET state = 'delivered', fence = r.fence + 1, lease_until = NULL, updated_at = @now,
           finished_at = @now, reason = cur.reason
      FROM cur
     WHERE r.id = cur.id AND r.fence = cur.fence
       AND (r.state IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')
         OR (r.state = 'sending' AND r.lease_until <= @now)) IS TRUE
 RETURNING r.id, cur.old_state, r.fence, r.reason
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, 'delivered', fence, @actor, 'settled_by_lookup', reason, @now FROM upd
)
SELECT id FROM upd;

-- name: SettleQueued
-- A worker settles reminders whose message it holds without sending: rows
-- still at the message's fence and waiting for it (leased, enqueued or
-- retrying) move to @state under a new fence, their events coded @code
-- (pkg/reminder decides the state from the code): expired when the deadline
-- is reached (with @deadline_reached, only rows at or past it) or no capacity
-- is left before it, quarantined when the message keeps failing its
-- consumer (an operator replays or expires it), delivered when the provider
-- turns out to hold an earlier attempt's message. A reminder that ends expired
-- after an attempt nobody learned the outcome of says so. A Store bound to a
-- channel (@channel not empty: a worker's) moves only rows of that channel.
WITH m AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[]) AS m(id, fence)
), cur AS (
    SELECT r.id, r.state AS old_state, m.fence FROM m JOIN reminders r ON r.id = m.id
), upd AS (
    UPDATE reminders r
       SET state = @state::text, fence = r.fence + 1, lease_until = NULL, updated_at = @now,
           finished_at = CASE WHEN @state::text IN ('expired', 'delivered') THEN @now::timestamptz END,
           reason = @reason::text || CASE WHEN @state::text = 'expired' AND nudge_outcome_unknown(r.id)
                                          THEN '; an earlier attempt''s outcome is unknown' ELSE '' END
      FROM cur
     WHERE r.id = cur.id AND r.fence = cur.fence AND (r.state IN ('leased', 'enqueued', 'retrying')) IS TRUE
       AND (NOT @deadline_reached::boolean OR r.deadline <= @now)
       AND (@channel::text = '' OR r.channel = @channel::text)
 RETURNING r.id, cur.old_state, r.fence, r.reason
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, @state::text, fence, @actor, @code::text, reason, @now FROM upd
)
SELECT id FROM upd;

-- name: LoadForDelivery
-- The rows, with their zone and the send window that applies (their own,
-- else the policy's: nudge_send_window), the window's times in minutes.
SELECT r.id, r.tenant, r.channel, r.recipient, r.template, r.data, r.due_at, r.deadline, r.idempotency_key,
       r.state, r.fence, r.attempts, r.next_attempt_at, coalesce(r.tz, ''),
       (extract(epoch FROM w.window_open) / 60)::int, (extract(epoch FROM w.window_close) / 60)::int, w.window_days
  FROM reminders r
 CROSS JOIN LATERAL nudge_send_window(r.tenant, r.channel, r.window_open, r.window_close, r.window_days) w
 WHERE r.id = ANY(@ids::bigint[]);

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
    -- claimable: the row would be claimed but for its window (the snapshot's
    -- view; upd tests the row itself again).
    SELECT n.*, p.window_open, p.window_close, p.window_days,
           n.fence = n.want AND n.channel = @channel
           AND (n.state IN ('leased', 'enqueued', 'retrying')) IS TRUE
           AND n.deadline > @now AND n.due_at <= @now AS claimable
      FROM named n
      JOIN policies p ON p.tenant = n.tenant AND p.channel = n.channel AND p.own_open = n.own_open
                     AND p.own_close = n.own_close AND p.own_days = n.own_days
), opens AS MATERIALIZED (
    -- The window is evaluated only for rows otherwise claimable, and only
    -- when it is not "any time" (open NULL: open in every zone); once per
    -- distinct window and zone of the batch, not per row (a plpgsql call
    -- per row was a third of the statement's CPU under a window policy).
    SELECT k.*, nudge_window_open(k.window_open, k.window_close, k.window_days, coalesce(nullif(k.tz, ''), 'UTC'),
                                  @now::timestamptz) AS open
      FROM (SELECT DISTINCT w.window_open, w.window_close, w.window_days, w.tz
              FROM windowed w
             WHERE w.claimable AND w.window_open IS NOT NULL) k
), cur AS (
    SELECT w.id, w.state AS old_state, w.want AS fence
      FROM windowed w
      LEFT JOIN opens o ON o.window_open = w.window_open AND o.window_close = w.window_close
                       AND o.window_days = w.window_days AND o.tz = w.tz
     WHERE NOT w.claimable
        OR w.window_open IS NULL
        OR o.open
), upd AS (
    -- The reminder's first attempt, from enqueued, goes into the row's
    -- started slot (empty then, unless a replay reset the attempts); any
    -- other into an event. A folded one leaves started_fence = the new fence.
    UPDATE reminders r
       SET state = 'sending', fence = r.fence + 1, attempts = r.attempts + 1,
           lease_until = @lease_until, next_attempt_at = NULL, updated_at = @now,
           started_at = CASE WHEN r.state = 'enqueued' AND r.attempts = 0 AND r.started_at IS NULL
                             THEN @now::timestamptz ELSE r.started_at END,
           started_fence = CASE WHEN r.state = 'enqueued' AND r.attempts = 0 AND r.started_at IS NULL
                                THEN r.fence + 1 ELSE r.started_fence END,
           started_by = CASE WHEN r.state = 'enqueued' AND r.attempts = 0 AND r.started_at IS NULL
                             THEN @actor::text ELSE r.started_by END
      FROM cur
     WHERE r.id = cur.id AND r.fence = cur.fence AND r.channel = @channel
       AND (r.state IN ('leased', 'enqueued', 'retrying')) IS TRUE
       AND r.deadline > @now AND r.due_at <= @now
       AND (r.state = 'retrying' AND r.next_attempt_at > @now) IS NOT TRUE -- never before its back-off
 RETURNING r.id, cur.old_state, r.fence, r.attempts, r.started_fence IS NOT DISTINCT FROM r.fence AS fold
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, 'sending', fence, @actor, 'attempt_claimed', 'attempt ' || attempts || ' claimed', @now
      FROM upd
     WHERE NOT fold
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
           -- a delivery (code delivered) goes into the row's delivered slot:
           -- its time, fence and reason are the terminal row's own
           delivered_by = CASE WHEN o.code = 'delivered' THEN @actor::text ELSE r.delivered_by END,
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
     WHERE code <> 'delivered'
)
SELECT id FROM upd;

-- name: Defer
-- Messages handed back to wait for capacity, each until its turn: their
-- reminders stay where they are, under the same fence, but the clock the
-- reconciler watches restarts at the turn, so the wait (however many retry
-- tiers it takes) is not mistaken for a lost message. An enqueued row's
-- dispatch lease is cleared: the message in the worker's hands proves the
-- publish, whether or not its confirmation was recorded.
WITH m AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[], @untils::timestamptz[]) AS m(id, fence, until)
)
UPDATE reminders r
   SET enqueued_at = CASE WHEN r.state = 'enqueued' THEN m.until ELSE r.enqueued_at END,
       lease_until = CASE WHEN r.state = 'enqueued' THEN NULL ELSE r.lease_until END,
       next_attempt_at = CASE WHEN r.state = 'retrying' THEN m.until ELSE r.next_attempt_at END,
       updated_at = @now
  FROM m
 WHERE r.id = m.id AND r.fence = m.fence AND (r.state IN ('enqueued', 'retrying')) IS TRUE
RETURNING r.id;

-- name: UnknownAttempts
-- The attempts of the given reminders, other than the given attempts (the
-- ones in hand), whose outcome is unknown (as nudge_outcome_unknown, schema
-- version 9, judges): the provider may hold their message, so the worker asks
-- it before sending again or letting the reminder expire.
SELECT a.reminder_id, a.id, coalesce(a.provider_message_id, ''), a.started_at, coalesce(a.provider, '')
  FROM delivery_attempts a
 WHERE a.reminder_id = ANY(@ids::bigint[]) AND a.id <> ALL(@except::bigint[])
   AND (a.outcome IS NULL
     OR a.result = 'unknown'
     OR (a.result IS NULL AND a.outcome = 'retryable' AND a.error ~ '\((timeout|network|unknown|canceled)\)'))
 ORDER BY a.reminder_id, a.id;

-- name: AttemptProvider
-- Records the provider an attempt's request goes to, before it leaves, when
-- it is not the one the claim recorded (provider failover: a probe of the
-- first provider, or a switch since the claim). Writes no reminders.
UPDATE delivery_attempts SET provider = @provider WHERE id = @id;

-- name: MessageStatus
-- Records the delivery status a provider reported for a message (a Twilio
-- status callback), only forward: a report of a lower rank than the one
-- recorded changes nothing. Returns the status now recorded. Writes no
-- reminders.
INSERT INTO sms_message_status AS s (message_sid, status, rank, error_code, reported_at)
VALUES (@sid, @status, @rank, @error_code, @now)
ON CONFLICT (message_sid) DO UPDATE
   SET status = EXCLUDED.status, rank = EXCLUDED.rank, error_code = EXCLUDED.error_code,
       reported_at = EXCLUDED.reported_at
 WHERE s.rank < EXCLUDED.rank;

-- name: FailoverCurrent
-- The channel's provider in use and when its next probe of the first
-- provider is due, creating the row on the first provider when there is none.
WITH ins AS (
    INSERT INTO provider_failover (channel, current, window_start, chosen_at)
    VALUES (@channel, @first, @now, @now)
    ON CONFLICT (channel) DO NOTHING
    RETURNING current, probe_at
)
SELECT current, probe_at FROM ins
UNION ALL
SELECT current, probe_at FROM provider_failover WHERE channel = @channel AND NOT EXISTS (SELECT 1 FROM ins);

-- name: FailoverCount
-- Counts a worker's send results against the provider, if it is still the
-- channel's current one (a report from a worker that has not yet seen a
-- switch changes nothing): @successes successful sends, then, with @failed,
-- one retryable failure (a success breaks a run of failures). It restarts
-- the error-rate window when it is over, and returns the counts the
-- failover decision reads.
UPDATE provider_failover
   SET failures = CASE WHEN @failed::boolean
                       THEN CASE WHEN @successes::integer > 0 THEN 0 ELSE failures END + 1
                       ELSE 0 END,
       window_start = CASE WHEN window_start + @window::interval <= @now THEN @now ELSE window_start END,
       window_sends = CASE WHEN window_start + @window::interval <= @now THEN 0 ELSE window_sends END
                      + @successes::integer + CASE WHEN @failed::boolean THEN 1 ELSE 0 END,
       window_failures = CASE WHEN window_start + @window::interval <= @now THEN 0 ELSE window_failures END
                         + CASE WHEN @failed::boolean THEN 1 ELSE 0 END
 WHERE channel = @channel AND current = @provider
RETURNING failures, window_sends, window_failures;

-- name: FailoverSwitch
-- Moves the channel from one provider to another, only if it is still on
-- the first (of two workers that decide at once, one switches), with fresh
-- counts and the given next probe time (NULL back on the first provider).
UPDATE provider_failover
   SET current = @to, failures = 0, window_start = @now, window_sends = 0, window_failures = 0,
       chosen_at = @now, probe_at = @probe_at
 WHERE channel = @channel AND current = @from
RETURNING current;

-- name: FailoverClaimProbe
-- Takes the channel's due probe of its first provider: one worker of the
-- fleet wins it (its row comes back) and pushes the next one out.
UPDATE provider_failover
   SET probe_at = @next
 WHERE channel = @channel AND current <> @first AND probe_at <= @now
RETURNING current;

-- name: NoteEvents
-- Notes (reminder.Notes: events that are not transitions) on the named
-- reminders, each with its own reason: from_state = to_state = the state the
-- row is in, at its current fence. A reminder that does not exist gets
-- none. Writes no reminders.
INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
SELECT r.id, r.state, r.state, r.fence, @actor, @code, n.reason, @now
  FROM unnest(@ids::bigint[], @reasons::text[]) AS n(id, reason)
  JOIN reminders r ON r.id = n.id;
