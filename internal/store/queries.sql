-- Every statement the dispatcher, workers and reconciler run against the
-- reminders. Each transition is one statement that updates the rows,
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
-- Since schema version 32 a reminder's state lives in its reminder_state row
-- (alias s: state, fence, times, leases, slots, and the tenant, channel,
-- zone and own window it is judged by), which every statement here reads,
-- locks and writes; the wide reminders row (alias r) is only joined by
-- primary key for what only it holds (recipient, template, data, the
-- idempotency key), never locked or written. Migration 32's mirror copies
-- each write of reminder_state to reminders within the statement's
-- transaction, for the previous release's binaries (the next release drops
-- the mirror and the state columns of reminders: nothing here reads them).
-- The dispatcher's claims (ClaimDue, Reclaim) read no wide row at all.
--
-- Statements that work on rows named by id test the state as
-- "(s.state ...) IS TRUE". The planner cannot prove a partial index's
-- predicate from that form, so it looks the rows up by primary key. From a
-- plain "s.state IN (...)" it proves the predicate of reminder_state_pending_due
-- or reminder_state_leases (reminder_state_unsent_deadline before schema 45)
-- and, on a table without statistics (just after a bulk intake), estimates a
-- scan of that index at a few rows: the scan then reads every open row to
-- find a batch of 50 (20 ms at a 20,000-row backlog, against 2 ms by key).
--
-- A statement that means to read an index whose predicate is written with
-- the C collation states its test the same way: ClaimDue "s.state =
-- 'pending' COLLATE "C"" (reminder_state_claim, schema 40), the expiries
-- "state COLLATE "C" IN (...)" (reminder_state_expiry, schema 42). No other
-- test of the state proves those predicates, and those tests prove no
-- other index's, so after a quiet spell (statistics that say no row is
-- open) no statement reads another's index.

-- name: ClaimDue
-- pending rows due before the run's fixed cutoff become enqueued under a new
-- fence, a dispatch lease and the claim's batch number (the dispatcher then
-- publishes them and records one confirmation for the batch: see
-- ConfirmPublished and ResolveExpiredLeases); those already past their
-- deadline become expired instead. A batch
-- takes an even part from every tenant with due rows (round robin, each
-- tenant's in due order), so a tenant's large backlog is published
-- interleaved with the other tenants' reminders, not ahead of them. The
-- tenants are found by a skip scan of reminder_state_claim: one index
-- probe per tenant with pending rows. Every probe and pick tests the state
-- as s.state = 'pending' COLLATE "C", the predicate of that index and of
-- no other (schema 40), so that whatever the statistics say (a table
-- analyzed while nothing was pending says no row is) the planner cannot
-- take another partial index holding pending rows, scan it whole and sort.
-- It reads no wide row (the zone
-- and own window are on the state row) and returns no idempotency key: the
-- dispatcher's message carries the id and fence, and the worker takes the
-- key from the row its claim reads (ClaimForDelivery, LoadForDelivery).
WITH RECURSIVE tenants(tenant) AS (
    (SELECT s.tenant FROM reminder_state s WHERE s.state = 'pending' COLLATE "C" ORDER BY s.tenant LIMIT 1)
  UNION ALL
    SELECT (SELECT s.tenant FROM reminder_state s
             WHERE s.state = 'pending' COLLATE "C" AND s.tenant > t.tenant ORDER BY s.tenant LIMIT 1)
      FROM tenants t
     WHERE t.tenant IS NOT NULL
), due_tenants AS (
    SELECT t.tenant FROM tenants t
     WHERE t.tenant IS NOT NULL
       -- the tenant's earliest pending row, one probe of reminder_state_claim
       AND (SELECT s.due_at FROM reminder_state s
             WHERE s.state = 'pending' COLLATE "C" AND s.tenant = t.tenant
             ORDER BY s.due_at LIMIT 1) <= @cutoff
), quota AS (
    SELECT greatest(1, ceil(@limit::float8 / count(*)))::bigint AS n FROM due_tenants
), picks AS (
    SELECT p.id, p.due_at, p.turn
      FROM due_tenants t
     CROSS JOIN LATERAL (
           SELECT s.id, s.due_at, row_number() OVER (ORDER BY s.due_at, s.id) AS turn
             FROM reminder_state s
            WHERE s.state = 'pending' COLLATE "C" AND s.tenant = t.tenant AND s.due_at <= @cutoff
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

-- name: Reclaim
-- The reconciler's republish: rows whose message is presumed lost (enqueued or
-- retrying and overdue) or whose worker died mid-send (sending, lease expired)
-- are enqueued again under a new fence, a dispatch lease and a batch number,
-- as ClaimDue does, to be published again. Rows already past their deadline
-- are left to ExpireOverdue, and enqueued or retrying rows of the @waiting
-- channels (whose work queue has a backlog or no consumer: the message is
-- waiting, not lost) are left where they are. Like ClaimDue it reads no
-- wide row and returns no idempotency key.
WITH stuck AS (
    SELECT id, state AS old_state
      FROM reminder_state
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
    UPDATE reminder_state s
       SET state = CASE WHEN s.republishes >= @max_republishes THEN 'quarantined' ELSE 'enqueued' END,
           fence = s.fence + 1, republishes = s.republishes + 1, updated_at = @now,
           lease_until = CASE WHEN s.republishes >= @max_republishes THEN NULL ELSE @lease_until::timestamptz END,
           enqueued_at = CASE WHEN s.republishes >= @max_republishes THEN s.enqueued_at ELSE @now::timestamptz END,
           dispatch_batch = CASE WHEN s.republishes >= @max_republishes THEN s.dispatch_batch ELSE batch.id END,
           reason = CASE WHEN s.republishes >= @max_republishes
                         THEN 'republished ' || s.republishes || ' times without an outcome' ELSE s.reason END
      FROM stuck, batch
     WHERE s.id = stuck.id
 RETURNING s.id, stuck.old_state, s.state, s.fence, s.channel, s.tenant, s.deadline, s.attempts,
           s.reason, s.due_at, s.dispatch_batch
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
SELECT id, state, fence, channel, tenant, deadline, attempts, due_at, dispatch_batch, old_state
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
    SELECT s.id, s.state AS old_state, m.fence FROM m JOIN reminder_state s ON s.id = m.id
), upd AS (
    UPDATE reminder_state s
       SET state = 'pending', fence = s.fence + 1, lease_until = NULL, enqueued_at = NULL,
           dispatch_batch = NULL, updated_at = @now, last_error = @reason
      FROM cur
     WHERE s.id = cur.id AND s.fence = cur.fence AND (s.state IN ('leased', 'enqueued')) IS TRUE
 RETURNING s.id, cur.old_state, s.fence
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
    SELECT s.id, s.state AS old_state, c.confirmed_at
      FROM reminder_state s
      LEFT JOIN publish_confirms c ON c.batch = s.dispatch_batch AND s.state = 'enqueued'
     WHERE s.state IN ('leased', 'enqueued') AND s.lease_until <= @now
     ORDER BY s.lease_until
     LIMIT @limit
       FOR UPDATE OF s SKIP LOCKED
), upd AS (
    UPDATE reminder_state s
       SET state          = CASE WHEN stale.confirmed_at IS NULL THEN 'pending' ELSE s.state END,
           fence          = CASE WHEN stale.confirmed_at IS NULL THEN s.fence + 1 ELSE s.fence END,
           enqueued_at    = CASE WHEN stale.confirmed_at IS NULL THEN NULL ELSE s.enqueued_at END,
           dispatch_batch = CASE WHEN stale.confirmed_at IS NULL THEN NULL ELSE s.dispatch_batch END,
           lease_until    = NULL,
           updated_at     = @now
      FROM stale
     WHERE s.id = stale.id
 RETURNING s.id, stale.old_state, s.state, s.fence
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
-- The rows not being sent are found by deadline (reminder_state_expiry, its
-- predicate stated as the index states it: schema 42),
-- the sending ones among the send leases that ran out (reminder_state_leases:
-- since schema version 31 no deadline index holds sending rows); each part
-- yields at most @limit, oldest deadline first, so their union holds the
-- @limit oldest. The rows are then locked by primary key, and the whole
-- test, written "(...) IS TRUE" so that it cannot pick an index, is made
-- again on the version locked.
WITH candidates AS (
    (SELECT id, deadline FROM reminder_state
      WHERE deadline <= @now AND state COLLATE "C" IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')
        AND NOT (channel = ANY(@hold_channels::text[]) AND deadline > @now - @hold_for::interval
                 AND id <> ALL(@looked::bigint[]) AND nudge_outcome_unknown(id))
      ORDER BY deadline
      LIMIT @limit)
    UNION ALL
    (SELECT id, deadline FROM reminder_state
      WHERE state = 'sending' AND lease_until <= @now AND deadline <= @now
        AND NOT (channel = ANY(@hold_channels::text[]) AND deadline > @now - @hold_for::interval
                 AND id <> ALL(@looked::bigint[]) AND nudge_outcome_unknown(id))
      ORDER BY deadline
      LIMIT @limit)
), late AS (
    SELECT s.id, s.state AS old_state
      FROM reminder_state s
     WHERE s.id IN (SELECT c.id FROM candidates c ORDER BY c.deadline LIMIT @limit)
       AND (s.deadline <= @now
            AND (s.state IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')
              OR (s.state = 'sending' AND s.lease_until <= @now))) IS TRUE
     ORDER BY s.deadline
     LIMIT @limit
       FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE reminder_state s
       SET state = 'expired', fence = s.fence + 1, lease_until = NULL, updated_at = @now,
           finished_at = @now,
           reason = CASE late.old_state
                        WHEN 'sending' THEN 'deadline passed; last send attempt outcome unknown'
                        ELSE 'deadline passed while ' || late.old_state
                             || CASE WHEN nudge_outcome_unknown(s.id) THEN '; an earlier attempt''s outcome is unknown'
                                     ELSE '' END END
      FROM late
     WHERE s.id = late.id
 RETURNING s.id, late.old_state, s.fence, s.reason, s.channel
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, 'expired', fence, @actor, 'deadline_passed', reason, @now FROM upd
)
SELECT channel, count(*), count(*) FILTER (WHERE old_state = 'sending') FROM upd GROUP BY channel;

-- name: UnknownAtDeadline
-- The reminders ExpireOverdue holds for a lookup (see there), oldest
-- deadline first, leaving out the @skip (asked about already this pass).
-- Found as ExpireOverdue finds them: the rows not being sent by deadline,
-- the sending ones among the send leases that ran out (on the state rows),
-- the recipient and idempotency key joined from the wide row by key for the
-- @limit found, not before.
SELECT h.id, h.fence, h.state, h.channel, h.tenant, r.recipient, r.idempotency_key, h.deadline
  FROM (SELECT * FROM (
            (SELECT id, fence, state, channel, tenant, deadline
               FROM reminder_state
              WHERE deadline <= @now AND deadline > @now - @hold_for::interval
                AND state COLLATE "C" IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')
                AND channel = ANY(@channels::text[])
                AND id <> ALL(@skip::bigint[])
                AND nudge_outcome_unknown(id)
              ORDER BY deadline
              LIMIT @limit)
            UNION ALL
            (SELECT id, fence, state, channel, tenant, deadline
               FROM reminder_state
              WHERE state = 'sending' AND lease_until <= @now
                AND deadline <= @now AND deadline > @now - @hold_for::interval
                AND channel = ANY(@channels::text[])
                AND id <> ALL(@skip::bigint[])
                AND nudge_outcome_unknown(id)
              ORDER BY deadline
              LIMIT @limit)
        ) held
         ORDER BY deadline
         LIMIT @limit) h
  JOIN reminders r ON r.id = h.id
 ORDER BY h.deadline;

-- name: SettledByLookup
-- The reconciler asked the provider about the unknown attempts of these
-- reminders, at or past their deadline, and it holds the message: each row
-- still at its fence and where ExpireOverdue would expire it (open, or
-- sending under a send lease that ran out) is delivered, its reason saying
-- so, its event coded settled_by_lookup.
WITH m AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[], @reasons::text[]) AS m(id, fence, reason)
), cur AS (
    SELECT s.id, s.state AS old_state, m.fence, m.reason FROM m JOIN reminder_state s ON s.id = m.id
), upd AS (
    UPDATE reminder_state s
       SET state = 'delivered', fence = s.fence + 1, lease_until = NULL, updated_at = @now,
           finished_at = @now, reason = cur.reason
      FROM cur
     WHERE s.id = cur.id AND s.fence = cur.fence
       AND (s.state IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')
         OR (s.state = 'sending' AND s.lease_until <= @now)) IS TRUE
 RETURNING s.id, cur.old_state, s.fence, s.reason
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
    SELECT s.id, s.state AS old_state, m.fence FROM m JOIN reminder_state s ON s.id = m.id
), upd AS (
    UPDATE reminder_state s
       SET state = @state::text, fence = s.fence + 1, lease_until = NULL, updated_at = @now,
           finished_at = CASE WHEN @state::text IN ('expired', 'delivered') THEN @now::timestamptz END,
           reason = @reason::text || CASE WHEN @state::text = 'expired' AND nudge_outcome_unknown(s.id)
                                          THEN '; an earlier attempt''s outcome is unknown' ELSE '' END
      FROM cur
     WHERE s.id = cur.id AND s.fence = cur.fence AND (s.state IN ('leased', 'enqueued', 'retrying')) IS TRUE
       AND (NOT @deadline_reached::boolean OR s.deadline <= @now)
       AND (@channel::text = '' OR s.channel = @channel::text)
 RETURNING s.id, cur.old_state, s.fence, s.reason
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, @state::text, fence, @actor, @code::text, reason, @now FROM upd
)
SELECT id FROM upd;

-- name: LoadForDelivery
-- The rows, with their zone and the send window that applies (their own,
-- else the policy's: nudge_send_window), the window's times in minutes.
SELECT s.id, s.tenant, s.channel, r.recipient, r.template, r.data, s.due_at, s.deadline, r.idempotency_key,
       s.state, s.fence, s.attempts, s.next_attempt_at, coalesce(s.tz, ''),
       (extract(epoch FROM w.window_open) / 60)::int, (extract(epoch FROM w.window_close) / 60)::int, w.window_days
  FROM reminder_state s
  JOIN reminders r ON r.id = s.id
 CROSS JOIN LATERAL nudge_send_window(s.tenant, s.channel, s.window_open, s.window_close, s.window_days) w
 WHERE s.id = ANY(@ids::bigint[]);

-- name: ClaimForDelivery
-- A worker's conditional write before sending: rows of the worker's channel
-- still carrying the message's fence, due and before their deadline, become
-- sending under a new fence with a send lease; each gets an attempt row. An enqueued row is
-- accepted whether or not its batch's publish confirmation is recorded yet
-- (the message in hand proves the publish; the fence proves it is the
-- current one), and so is leased (rows of an earlier version's dispatcher).
-- It also returns every named row as the statement's snapshot saw it (before
-- the claim), and the new fence, attempt number and attempt id of those it
-- claimed (in one more row, of arrays: see the answer below), so a worker
-- with nothing to decide between reading and claiming (no rate limit) needs one round trip, and can tell why
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
    SELECT s.id, s.tenant, s.channel, r.recipient, r.template, r.data, s.due_at, s.deadline, r.idempotency_key,
           s.state, s.fence, s.attempts, s.next_attempt_at, coalesce(s.tz, '') AS tz, m.fence AS want,
           coalesce(s.window_open, time '24:00') AS own_open, coalesce(s.window_close, time '00:00') AS own_close,
           coalesce(s.window_days, -1) AS own_days
      FROM m JOIN reminder_state s ON s.id = m.id JOIN reminders r ON r.id = s.id
     WHERE s.id = ANY(@ids::bigint[]) -- by the primary key whatever the join
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
    UPDATE reminder_state s
       SET state = 'sending', fence = s.fence + 1, attempts = s.attempts + 1,
           lease_until = @lease_until, next_attempt_at = NULL, updated_at = @now,
           started_at = CASE WHEN s.state = 'enqueued' AND s.attempts = 0 AND s.started_at IS NULL
                             THEN @now::timestamptz ELSE s.started_at END,
           started_fence = CASE WHEN s.state = 'enqueued' AND s.attempts = 0 AND s.started_at IS NULL
                                THEN s.fence + 1 ELSE s.started_fence END,
           started_by = CASE WHEN s.state = 'enqueued' AND s.attempts = 0 AND s.started_at IS NULL
                             THEN @actor::text ELSE s.started_by END
      FROM cur
     WHERE s.id = cur.id AND s.fence = cur.fence AND s.channel = @channel
       AND (s.state IN ('leased', 'enqueued', 'retrying')) IS TRUE
       AND s.deadline > @now AND s.due_at <= @now
       AND (s.state = 'retrying' AND s.next_attempt_at > @now) IS NOT TRUE -- never before its back-off
 RETURNING s.id, cur.old_state, s.fence, s.attempts, s.started_fence IS NOT DISTINCT FROM s.fence AS fold
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
-- The answer: every named row as the snapshot saw it (its last five columns
-- NULL), then one row whose id is NULL carrying the claims as arrays, each
-- built once: upd's ids, new fences and attempt numbers, att's reminder ids
-- and attempt ids (NULL when nothing was claimed). The caller joins them by
-- id. Joined here (windowed LEFT JOIN upd LEFT JOIN att), the generic plan
-- took one row on each side and rescanned upd and att for every named row:
-- a cost in the square of the batch, dearer per row at 100 than at 50.
SELECT w.id, w.tenant, w.channel, w.recipient, w.template, w.data, w.due_at, w.deadline, w.idempotency_key,
       w.state, w.fence, w.attempts, w.next_attempt_at, w.tz,
       (extract(epoch FROM w.window_open) / 60)::int, (extract(epoch FROM w.window_close) / 60)::int, w.window_days,
       NULL::bigint[], NULL::bigint[], NULL::int[], NULL::bigint[], NULL::bigint[]
  FROM windowed w
 UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       u.ids, u.fences, u.attempts, a.reminder_ids, a.ids
  FROM (SELECT array_agg(id), array_agg(fence), array_agg(attempts) FROM upd) u(ids, fences, attempts)
 CROSS JOIN (SELECT array_agg(reminder_id), array_agg(id) FROM att) a(reminder_ids, ids);

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
    UPDATE reminder_state s
       SET state = o.state, next_attempt_at = o.next_attempt_at, lease_until = NULL,
           last_error = coalesce(nullif(o.error, ''), s.last_error),
           reason = nullif(o.reason, '')
                    || CASE WHEN o.state IN ('failed', 'expired') AND nudge_outcome_unknown(s.id, o.attempt_id)
                            THEN '; an earlier attempt''s outcome is unknown' ELSE '' END,
           finished_at = CASE WHEN o.state IN ('delivered', 'failed', 'expired') THEN @now::timestamptz END,
           -- a delivery (code delivered) goes into the row's delivered slot:
           -- its time, fence and reason are the terminal row's own
           delivered_by = CASE WHEN o.code = 'delivered' THEN @actor::text ELSE s.delivered_by END,
           updated_at = @now
      FROM o
     WHERE s.id = o.id AND s.fence = o.fence AND (s.state = 'sending') IS TRUE
 RETURNING s.id, s.state, s.fence, s.reason, o.code
), att AS (
    UPDATE delivery_attempts a
       SET finished_at = @now,
           outcome = o.outcome,
           result = o.result,
           provider_message_id = nullif(o.provider_id, ''),
           -- upd's ids as one array, built once (an InitPlan): a join
           -- with upd would rescan upd's rows for every attempt (the
           -- generic plan estimates one row there, so a nested loop),
           -- which cost more than the attempts' updates themselves at 50
           -- a batch and grew with the square of the batch.
           error = CASE WHEN NOT o.id = ANY(ARRAY(SELECT id FROM upd))
                        THEN concat_ws('; ', nullif(o.error, ''), 'recorded after the lease was taken over')
                        ELSE nullif(o.error, '') END
      FROM o
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
UPDATE reminder_state s
   SET enqueued_at = CASE WHEN s.state = 'enqueued' THEN m.until ELSE s.enqueued_at END,
       lease_until = CASE WHEN s.state = 'enqueued' THEN NULL ELSE s.lease_until END,
       next_attempt_at = CASE WHEN s.state = 'retrying' THEN m.until ELSE s.next_attempt_at END,
       updated_at = @now
  FROM m
 WHERE s.id = m.id AND s.fence = m.fence AND (s.state IN ('enqueued', 'retrying')) IS TRUE
RETURNING s.id;

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
SELECT s.id, s.state, s.state, s.fence, @actor, @code, n.reason, @now
  FROM unnest(@ids::bigint[], @reasons::text[]) AS n(id, reason)
  JOIN reminder_state s ON s.id = n.id;

-- name: PromoterLock
-- A promoter pass's first statement (promote.go): the watermark row locked
-- (passes serialize; a second dispatcher's waits here), so PromoterRead's
-- look at pg_locks comes after any pass before it committed. The pass
-- commits asynchronously (no WAL flush of its own: a pass with nothing lazy
-- is otherwise an fsync per dispatcher run): it is idempotent, a crash that
-- loses its commit loses its state rows and its watermark together, and
-- anything done with a promoted row (a claim, a cancel) commits
-- synchronously later, which flushes the WAL up to it.
SELECT set_config('synchronous_commit', 'off', true) FROM nudge_promoter FOR UPDATE;

-- name: PromoterRead
-- A promoter pass's second statement, before Promote takes its
-- snapshot (the row is locked by PromoterLock): it returns the row, the farthest a sweep begun now
-- may reach (the database's clock plus the smaller of the pass's horizon
-- @ahead and lazy intake's: a transaction that takes its lock on reminders
-- after this read writes lazy reminders due only past it), the virtual ids
-- of the transactions that hold a write lock on reminders now (pg_locks
-- needs no privilege; virtual ids, so a writer that has no xid yet counts),
-- and those of the writers stored at the last complete sweep's start
-- (prov_wait) that are still in flight (they hold their virtualxid lock).
-- Both from one read of pg_locks (a CTE, evaluated once), so a writer of
-- prov_wait is either still waited for or gone in the same read (schema
-- 46's floors: promote.go's startSweep). Two-phase transactions hold no
-- virtualxid lock once prepared: Nudge's writers do not use them.
-- Schema 46's columns are read through the row's jsonb, not by name: on
-- an install at 43, 46 waits behind the after-rollout step 44 while this
-- release's dispatcher already runs; there the row has no floors (the
-- fourth column is false, the two arrays NULL), the pass saves with
-- PromoterSaveSchema45 and every sweep starts at final, as before.
WITH locks AS MATERIALIZED (
    SELECT l.locktype, l.relation, l.database, l.mode, l.granted, l.pid, l.virtualxid, l.virtualtransaction
      FROM pg_locks l
     WHERE l.locktype = 'virtualxid'
        OR (l.locktype = 'relation' AND l.relation = 'reminders'::regclass)
)
SELECT p.final_until, p.prov_until, p.prov_wait, to_jsonb(p) ? 'floor_wait',
       CASE WHEN jsonb_typeof(to_jsonb(p) -> 'floor_wait') = 'array'
            THEN ARRAY(SELECT e FROM jsonb_array_elements_text(to_jsonb(p) -> 'floor_wait') WITH ORDINALITY AS u (e, o)
                        ORDER BY o) END,
       CASE WHEN jsonb_typeof(to_jsonb(p) -> 'floor_at') = 'array'
            THEN ARRAY(SELECT e::timestamptz FROM jsonb_array_elements_text(to_jsonb(p) -> 'floor_at') WITH ORDINALITY AS u (e, o)
                        ORDER BY o) END,
       p.sweep_until, p.sweep_wait, p.sweep_prev_done, p.cursor_due, p.cursor_id,
       statement_timestamp()
       + least(@ahead::interval, coalesce((SELECT l.horizon FROM nudge_lazy_intake l), @ahead::interval)),
       coalesce((SELECT array_agg(DISTINCT w.virtualtransaction)
                   FROM locks w
                  WHERE w.locktype = 'relation'
                    AND w.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                    AND w.mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
                    AND w.granted AND w.pid IS DISTINCT FROM pg_backend_pid()), '{}'),
       coalesce((SELECT array_agg(DISTINCT v.virtualxid)
                   FROM locks v
                  WHERE v.locktype = 'virtualxid' AND v.virtualxid = ANY(p.prov_wait)), '{}')
  FROM nudge_promoter p;

-- name: Promote
-- One bounded step of a sweep: the state rows of the next @limit lazy
-- reminders after (@after_due, @after_id) and due before @until, in
-- (due_at, id) order (reminders_due_order, index-only once vacuumed), so
-- the state rows of one minute are written together. A reminder that has
-- its row (promoted by an earlier sweep, or by a write before slice 3's
-- materialization) keeps it. Returns the reminders read, the rows inserted,
-- the last key read (the next cursor), and whether any lazy reminder is due
-- at or after @until (none: nothing bounds the claim): the first entry of
-- reminders_due_order at or past @until, an index scan that stops at its
-- first tuple. Not an EXISTS: the planner drops an EXISTS subquery's ORDER
-- BY and LIMIT and, with few or no lazy rows, read all of reminders in a
-- sequential scan on every pass (~1 ms at a few 10,000 rows, per pass of a
-- loop at --min-gap; TestPromoteBeyondReadsTheDueOrder).
WITH scan AS MATERIALIZED (
    SELECT r.id, r.tenant, r.channel, r.due_at, r.deadline, r.tz, r.window_open, r.window_close, r.window_days
      FROM reminders r
     WHERE r.lazy AND (r.due_at, r.id) > (@after_due::timestamptz, @after_id::bigint)
       AND r.due_at < @until::timestamptz
     ORDER BY r.due_at, r.id
     LIMIT @limit
), ins AS (
    INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days)
    SELECT id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days
      FROM scan
     ORDER BY due_at, id
        ON CONFLICT (id) DO NOTHING
    RETURNING 1
), last AS (
    SELECT due_at, id FROM scan ORDER BY due_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM scan), (SELECT count(*) FROM ins), (SELECT due_at FROM last), (SELECT id FROM last),
       (SELECT r.due_at FROM reminders r
         WHERE r.lazy AND r.due_at >= @until::timestamptz
         ORDER BY r.due_at, r.id
         LIMIT 1) IS NOT NULL;

-- name: PromoterSave
-- The watermark after a pass (decided by promote.go's startSweep and
-- afterPass). A completed sweep's writers become the ones the next sweep
-- waits for (@prov_wait; NULL keeps them); a sweep started by this pass
-- stores its writers' floors (@floor_wait, @floor_at; NULL keeps them).
UPDATE nudge_promoter
   SET final_until = @final_until, prov_until = @prov_until, prov_wait = coalesce(@prov_wait::text[], prov_wait),
       floor_wait = coalesce(@floor_wait::text[], floor_wait), floor_at = coalesce(@floor_at::timestamptz[], floor_at),
       sweep_until = @sweep_until, sweep_wait = @sweep_wait, sweep_prev_done = @sweep_prev_done,
       cursor_due = @cursor_due, cursor_id = @cursor_id, passed_at = statement_timestamp(), ahead = @ahead::interval;

-- name: PromoterSaveSchema45
-- PromoterSave on a schema before 46 (no floors: PromoterRead's fourth
-- column false), during a rollout from a release before 44.
UPDATE nudge_promoter
   SET final_until = @final_until, prov_until = @prov_until, prov_wait = coalesce(@prov_wait::text[], prov_wait),
       sweep_until = @sweep_until, sweep_wait = @sweep_wait, sweep_prev_done = @sweep_prev_done,
       cursor_due = @cursor_due, cursor_id = @cursor_id, passed_at = statement_timestamp(), ahead = @ahead::interval;

-- name: EnvelopeLimitExists
-- Whether the envelope limit's table (after-rollout migration 49) exists:
-- before it, EnvelopeLimit's statement would not parse.
SELECT to_regclass('nudge_envelope_limit') IS NOT NULL;

-- name: EnvelopeLimit
-- The most reminders a dispatcher puts in one envelope (schema 49).
SELECT max_entries FROM nudge_envelope_limit;
