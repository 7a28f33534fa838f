-- Two layouts of the reminder's columns, measured against today's by
-- BenchmarkLayouts and BenchmarkLayoutsSpreadClaim (layout_bench_test.go),
-- issue 18. Test-only SQL: a measured design slice, not Nudge's schema (no
-- migration creates these tables; schema/transitions_test.go skips testdata).
--
-- Each layout is built in a scratch schema that the real migrations made and
-- the real intake filled: DropMirror below takes schema version 32's
-- reminder_state and its mirror away (every layout, today's included, is
-- the design without the mirror), then the Setup statement moves the rows
-- into the layout's tables. "Today" is schema version 31, the last release
-- whose statements wrote the wide row: testdata/queries_v31.sql. (Since
-- version 32 internal/store/queries.sql runs layout A on the real
-- reminder_state, mirrored to reminders for the previous release, with A''s
-- claim; its worker's claim reads the zone and window from the state row
-- too.) The three hot statements are version 31's
-- ClaimDue, ClaimForDelivery and RecordOutcomes, with the same fences, state
-- checks, events and returned columns, written once for both layouts over two
-- table names the Go code fills in:
--   {hot}  the table that holds state, fence, leases and the happy path's
--          slots, and every index whose predicate names state;
--   {cold} the table that holds what the statements only read: recipient,
--          template, data, idempotency key, zone and own send window.
-- Layout A (narrow): {hot} = reminder_state, {cold} = reminders (the wide row,
-- written at intake and rarely after). Layout B (split): {hot} = reminders
-- without its payload, {cold} = reminder_payloads.
--
-- The statements differ from today's only in where they read a column: the
-- rows they lock (FOR UPDATE OF r) and rewrite are {hot}'s; {cold} is joined
-- by primary key for the payload and the own window, never written. The
-- dispatcher's claim reads the zone, own window and idempotency key from
-- {claim_from}: {cold}, or in layout A' reminder_state's own copies of the
-- zone and window and no key (a message of id and fence only), a bound on
-- what a claim that touches no wide row would gain (PostgreSQL 15 does not
-- remove that self-join: one more primary-key probe of a page just read).

-- name: DropMirror
-- Schema version 32's reminder_state (with its indexes, policies and the
-- reverse trigger) and the triggers that mirror reminders into it: run on
-- every layout's schema after the intake filled it, so that today's
-- statements write the wide row alone and SetupNarrow builds its own
-- reminder_state. CASCADE takes what reads the real one (the view, once it
-- does), which none of the layouts' statements use. Version 34's plain key
-- index goes too: version 31, today's layout, had none (SetupNarrow builds
-- it for layout A, as planned).
DROP TRIGGER IF EXISTS reminders_state_mirror_inserted ON reminders;
DROP TRIGGER IF EXISTS reminders_state_mirror_updated ON reminders;
DROP TABLE IF EXISTS reminder_state CASCADE;
DROP INDEX IF EXISTS reminders_keys;

-- name: SetupNarrow
-- Layout A: the hot columns move to reminder_state (tenant and channel
-- copied: the claim's tenant skip scan and the worker's channel test read
-- them from its indexes), with every index whose predicate names state
-- (StateIndexes, built next); the
-- wide row keeps its primary key, the unique (tenant, key) and, in place of
-- the two key indexes that name state in their predicate or INCLUDE (waiting
-- and campaign keys), one plain key index. Its hot columns stay behind,
-- stale (dropping them would rewrite the table; nothing here reads them).
-- The zone and own window are copied too (NULL in the bench's rows, they
-- cost no byte there): only layout A' reads them from here.
CREATE TABLE reminder_state (
    id               bigint PRIMARY KEY,
    tenant           text NOT NULL,
    channel          text NOT NULL CHECK (channel IN ('email', 'sms', 'webhook')),
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined',
                                      'delivered', 'failed', 'expired', 'canceled')),
    fence            bigint NOT NULL DEFAULT 0,
    due_at           timestamptz NOT NULL,
    deadline         timestamptz NOT NULL,
    lease_until      timestamptz,
    attempts         integer NOT NULL DEFAULT 0,
    republishes      integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    enqueued_at      timestamptz,
    dispatch_batch   bigint,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    purged_at        timestamptz,
    requested_due_at timestamptz,
    claimed_at       timestamptz,
    claimed_fence    bigint,
    started_at       timestamptz,
    started_fence    bigint,
    claimed_by       text,
    started_by       text,
    delivered_by     text,
    reason           text,
    last_error       text,
    tz               text,
    window_open      time,
    window_close     time,
    window_days      integer,
    CONSTRAINT reminder_state_deadline_after_due CHECK (deadline > due_at)
);
INSERT INTO reminder_state
SELECT id, tenant, channel, state, fence, due_at, deadline, lease_until, attempts, republishes, next_attempt_at,
       enqueued_at, dispatch_batch, updated_at, finished_at, purged_at, requested_due_at, claimed_at, claimed_fence,
       started_at, started_fence, claimed_by, started_by, delivered_by, reason, last_error,
       tz, window_open, window_close, window_days
  FROM reminders ORDER BY id;
DROP INDEX IF EXISTS reminders_campaign_keys, reminders_enqueued, reminders_expired, reminders_leases, reminders_parked,
           reminders_pending_due, reminders_pending_tenant, reminders_replayable, reminders_retrying,
           reminders_terminal, reminders_terminal_unpurged, reminders_unsent_deadline, reminders_waiting_keys;
CREATE INDEX reminders_keys ON reminders (tenant, key text_pattern_ops);

-- name: SetupSplit
-- Layout B: the payload (recipient, template, data, idempotency key, zone and
-- own window) moves out to reminder_payloads; the reminders row keeps its
-- keys, times, state and slots, with all of today's indexes (StateIndexes
-- builds those whose predicate names state) and checks
-- (requested_due_at stays: the dispatcher's claim writes it when a window is
-- closed). The table is rebuilt (a dropped column would stay in every tuple
-- until a rewrite); DROP ... CASCADE takes the view and the policies that
-- named the old one, which the three statements do not use.
CREATE TABLE reminder_payloads (
    id              bigint PRIMARY KEY,
    recipient       text NOT NULL,
    template        text NOT NULL,
    data            jsonb NOT NULL DEFAULT '{}',
    idempotency_key text NOT NULL,
    tz              text,
    window_open     time,
    window_close    time,
    window_days     integer
);
INSERT INTO reminder_payloads
SELECT id, recipient, template, data, idempotency_key, tz, window_open, window_close, window_days
  FROM reminders ORDER BY id;
CREATE TABLE reminders_split (
    id               bigint PRIMARY KEY,
    tenant           text NOT NULL,
    key              text NOT NULL,
    channel          text NOT NULL CHECK (channel IN ('email', 'sms', 'webhook')),
    due_at           timestamptz NOT NULL,
    deadline         timestamptz NOT NULL,
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined',
                                      'delivered', 'failed', 'expired', 'canceled')),
    fence            bigint NOT NULL DEFAULT 0,
    lease_until      timestamptz,
    attempts         integer NOT NULL DEFAULT 0,
    republishes      integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    enqueued_at      timestamptz,
    last_error       text,
    reason           text,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    purged_at        timestamptz,
    dispatch_batch   bigint,
    requested_due_at timestamptz,
    claimed_at       timestamptz,
    claimed_fence    bigint,
    claimed_by       text,
    started_at       timestamptz,
    started_fence    bigint,
    started_by       text,
    delivered_by     text,
    CHECK (deadline > due_at)
);
INSERT INTO reminders_split
SELECT id, tenant, key, channel, due_at, deadline, state, fence, lease_until, attempts, republishes, next_attempt_at,
       enqueued_at, last_error, reason, created_at, updated_at, finished_at, purged_at, dispatch_batch, requested_due_at,
       claimed_at, claimed_fence, claimed_by, started_at, started_fence, started_by, delivered_by
  FROM reminders ORDER BY id;
DROP TABLE reminders CASCADE;
ALTER TABLE reminders_split RENAME TO reminders;
ALTER INDEX reminders_split_pkey RENAME TO reminders_pkey;
ALTER TABLE reminders ADD CONSTRAINT reminders_logical_key UNIQUE (tenant, key);
CREATE INDEX reminders_campaign_keys ON reminders (tenant, key text_pattern_ops) INCLUDE (state)
    WHERE key LIKE 'campaign:%';
CREATE INDEX reminders_waiting_keys ON reminders (tenant, key text_pattern_ops)
    WHERE state IN ('pending', 'leased', 'retrying', 'quarantined') AND key IS NOT NULL;

-- name: StateIndexes
-- Today's indexes whose predicate names state, on {hot} (with its name as
-- their prefix), built after each layout's Setup: in layout A they leave the
-- wide row, in layout B they stay on it, rebuilt with the table.
CREATE INDEX {hot}_enqueued ON {hot} (enqueued_at) WHERE state = 'enqueued';
CREATE INDEX {hot}_expired ON {hot} (finished_at) WHERE state = 'expired';
CREATE INDEX {hot}_leases ON {hot} (lease_until)
    WHERE state IN ('leased', 'enqueued', 'sending') AND lease_until IS NOT NULL;
CREATE INDEX {hot}_parked ON {hot} (channel, state) WHERE state IN ('leased', 'retrying', 'quarantined');
CREATE INDEX {hot}_pending_due ON {hot} (due_at, id) WHERE state = 'pending';
CREATE INDEX {hot}_pending_tenant ON {hot} (tenant, due_at, id) WHERE state = 'pending';
CREATE INDEX {hot}_replayable ON {hot} (due_at) WHERE state IN ('failed', 'quarantined');
CREATE INDEX {hot}_retrying ON {hot} (next_attempt_at) WHERE state = 'retrying';
CREATE INDEX {hot}_terminal ON {hot} (coalesce(finished_at, updated_at))
    WHERE state IN ('delivered', 'failed', 'expired', 'canceled');
CREATE INDEX {hot}_terminal_unpurged ON {hot} (coalesce(finished_at, updated_at))
    WHERE purged_at IS NULL AND state IN ('delivered', 'failed', 'expired', 'canceled');
CREATE INDEX {hot}_unsent_deadline ON {hot} (deadline)
    WHERE state IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined');

-- name: SpreadFill
-- The spread claim's table, as bench/cmd/nudge-bench's ScaleFill builds its
-- spread set: @size rows pending and scheduled for later (over the 30 days
-- after tomorrow, in random order, channels alternating, 16 tenants), and
-- among them, evenly over the id range, @due SMS rows due in the hour before
-- @now in random order, so a claim in due order takes rows from pages all
-- over the table. The payload is the bench's (a 12-character phone number,
-- the course-expiry template, {"course": "Go 101"}, a 70-character key).
INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key,
                       state, created_at, updated_at)
SELECT 'tenant-' || (i % 16), 'spread:' || i, t.channel,
       CASE WHEN t.channel = 'sms' THEN '+1415' || lpad(i::text, 7, '0') ELSE 'u' || i || '@example.com' END,
       'course-expiry', '{"course": "Go 101"}'::jsonb, t.due_at,
       CASE WHEN t.is_due THEN @now::timestamptz + interval '2 hours' ELSE t.due_at + interval '1 day' END,
       'nudge-' || lpad(to_hex(i), 64, '0'), 'pending', @now::timestamptz - interval '1 day',
       @now::timestamptz - interval '1 day'
  FROM generate_series(1, @size::bigint + @due::bigint) AS i,
       LATERAL (SELECT i % ((@size::bigint + @due::bigint) / @due::bigint) = 0 AS is_due) d,
       LATERAL (SELECT d.is_due,
                       CASE WHEN d.is_due OR i % 2 = 0 THEN 'sms' ELSE 'email' END AS channel,
                       CASE WHEN d.is_due THEN @now::timestamptz - interval '1 hour' + random() * interval '50 minutes'
                            ELSE @now::timestamptz + interval '1 day' + random() * interval '30 days' END AS due_at) t;

-- name: ClaimDue
WITH RECURSIVE tenants(tenant) AS (
    (SELECT r.tenant FROM {hot} r WHERE r.state = 'pending' ORDER BY r.tenant LIMIT 1)
  UNION ALL
    SELECT (SELECT r.tenant FROM {hot} r
             WHERE r.state = 'pending' AND r.tenant > t.tenant ORDER BY r.tenant LIMIT 1)
      FROM tenants t
     WHERE t.tenant IS NOT NULL
), due_tenants AS (
    SELECT t.tenant FROM tenants t
     WHERE t.tenant IS NOT NULL
       -- the tenant's earliest pending row, one probe of reminders_pending_tenant
       AND (SELECT r.due_at FROM {hot} r
             WHERE r.state = 'pending' AND r.tenant = t.tenant
             ORDER BY r.due_at LIMIT 1) <= @cutoff
), quota AS (
    SELECT greatest(1, ceil(@limit::float8 / count(*)))::bigint AS n FROM due_tenants
), picks AS (
    SELECT p.id, p.due_at, p.turn
      FROM due_tenants t
     CROSS JOIN LATERAL (
           SELECT r.id, r.due_at, row_number() OVER (ORDER BY r.due_at, r.id) AS turn
             FROM {hot} r
            WHERE r.state = 'pending' AND r.tenant = t.tenant AND r.due_at <= @cutoff
            ORDER BY r.due_at, r.id
            LIMIT (SELECT n FROM quota)) p
), due AS (
    -- The picked rows, locked, with what judging them needs (read here, not
    -- looked up again per row), and their own window as keys that = can
    -- join on (NULL never equals; the CHECK reminders_window keeps an own
    -- window's open below 24:00, its close from 00:00 and its days from -1).
    SELECT r.id, r.state AS old_state, r.tenant, r.channel, r.deadline, coalesce(c.tz, 'UTC') AS tz,
           c.window_open, c.window_close, c.window_days, r.claimed_at IS NULL AS claim_slot_empty,
           coalesce(c.window_open, time '24:00') AS own_open, coalesce(c.window_close, time '00:00') AS own_close,
           coalesce(c.window_days, -1) AS own_days, c.idempotency_key
      FROM {hot} r JOIN {claim_from} c ON c.id = r.id
     WHERE r.id IN (SELECT id FROM picks ORDER BY turn, due_at, id LIMIT @limit)
       AND (r.state = 'pending') IS TRUE AND r.due_at <= @cutoff
       FOR UPDATE OF r SKIP LOCKED
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
    SELECT d.id, d.old_state, d.claim_slot_empty, d.idempotency_key, d.deadline, d.tz, p.window_open, p.window_close, p.window_days,
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
    SELECT p.id, p.old_state, p.claim_slot_empty, p.idempotency_key,
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
    UPDATE {hot} r
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
 RETURNING r.id, j.old_state, r.state, r.fence, r.channel, r.tenant, j.idempotency_key, r.deadline, r.attempts,
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

-- name: ClaimForDelivery
WITH m AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[]) AS m(id, fence)
), named AS MATERIALIZED (
    -- Every named row as the statement's snapshot sees it (what the worker
    -- is answered), read once, with its own window as keys that = can join
    -- on (as in ClaimDue).
    SELECT r.id, r.tenant, r.channel, c.recipient, c.template, c.data, r.due_at, r.deadline, c.idempotency_key,
           r.state, r.fence, r.attempts, r.next_attempt_at, coalesce(c.tz, '') AS tz, m.fence AS want,
           coalesce(c.window_open, time '24:00') AS own_open, coalesce(c.window_close, time '00:00') AS own_close,
           coalesce(c.window_days, -1) AS own_days
      FROM m JOIN {hot} r ON r.id = m.id JOIN {cold} c ON c.id = r.id
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
    UPDATE {hot} r
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
WITH o AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[], @attempt_ids::bigint[], @states::text[],
                         @codes::text[], @results::text[], @outcomes::text[], @next_attempts::timestamptz[],
                         @errors::text[], @reasons::text[], @provider_ids::text[])
           AS o(id, fence, attempt_id, state, code, result, outcome, next_attempt_at, error, reason, provider_id)
), upd AS (
    UPDATE {hot} r
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
