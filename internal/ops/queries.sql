-- Every statement nudgectl's operator commands run. As in internal/store,
-- each decision is one statement that moves a batch of rows and appends their
-- events, guarded by the state and the fence the operator's view was taken
-- at: a row that moved on in between is left alone and reported. Time comes
-- from the caller (@now). Events carry the code of their transition
-- (pkg/reminder's Transitions, against which schema/transitions_test.go
-- checks every statement here that writes reminders).
--
-- State lives on reminder_state (schema 32, alias s): every state column is
-- read and written there, and the wide reminders row (r) is joined by its
-- primary key only for what only it has (key, recipient, template, data,
-- created_at). A statement that writes state locks state rows only; the
-- mirror (0032) copies the change to reminders in the same transaction, so
-- the previous release's readers see it.
--
-- A reminder due far ahead may have no state row yet (the promoter inserts
-- it shortly before it is due, schema 39): it is pending, at fence 0, with
-- no attempt, its times the wide row's intent as recorded. The statements
-- that name a reminder read it so (LEFT JOIN), the counts and ages add it
-- (nudge_unpromoted_due); the decisions that write (Replay, DLQReplay,
-- DLQExpire) select only states such a reminder is never in.

-- name: Replay
-- Controlled replay of a window or of chosen IDs, one batch after the id
-- cursor @after. Candidates are failed and quarantined reminders, and
-- leased, enqueued or retrying ones stuck since @stuck_before (delivered,
-- canceled, expired, sending and pending never are). A candidate goes back to
-- pending under a new fence unless its deadline is at or before @min_deadline
-- (now + the margin) or its payload was purged; with @apply false nothing is
-- written and the verdicts say what would happen (the dry run). Each returned
-- row carries its verdict: replay (done, or would be), refused_deadline,
-- refused_purged, moved_on (changed between the read and the write).
WITH cand AS (
    SELECT s.id, s.state AS old_state, s.fence,
           CASE WHEN s.purged_at IS NOT NULL THEN 'refused_purged'
                WHEN s.deadline <= @min_deadline THEN 'refused_deadline'
                ELSE 'replay' END AS verdict
      FROM reminder_state s
     WHERE s.id > @after
       AND (coalesce(cardinality(@ids::bigint[]), 0) = 0 OR s.id = ANY(@ids::bigint[]))
       AND (@due_from::timestamptz IS NULL OR s.due_at >= @due_from::timestamptz)
       AND (@due_to::timestamptz IS NULL OR s.due_at < @due_to::timestamptz)
       AND (@channel::text = '' OR s.channel = @channel::text)
       AND (@tenant::text = '' OR s.tenant = @tenant::text)
       AND s.state = ANY(@states::text[])
       AND (s.state IN ('failed', 'quarantined')
         OR (s.state = 'enqueued' AND s.enqueued_at <= @stuck_before)
         OR (s.state = 'retrying' AND s.next_attempt_at <= @stuck_before)
         OR (s.state = 'leased' AND s.lease_until <= @stuck_before))
     ORDER BY s.id
     LIMIT @limit
), upd AS (
    UPDATE reminder_state s
       SET state = 'pending', fence = s.fence + 1, lease_until = NULL, next_attempt_at = NULL,
           enqueued_at = NULL, finished_at = NULL, reason = NULL, updated_at = @now,
           attempts = CASE WHEN @reset_attempts::boolean THEN 0 ELSE s.attempts END,
           republishes = CASE WHEN @reset_attempts::boolean THEN 0 ELSE s.republishes END
      FROM cand
     WHERE @apply::boolean AND cand.verdict = 'replay'
       AND s.id = cand.id AND s.fence = cand.fence AND (s.state = cand.old_state) IS TRUE AND s.purged_at IS NULL
 RETURNING s.id, cand.old_state, s.fence
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, 'pending', fence, @actor, 'replayed', @reason, @now FROM upd
)
SELECT cand.id, cand.old_state,
       CASE WHEN @apply::boolean AND cand.verdict = 'replay' AND upd.id IS NULL THEN 'moved_on'
            ELSE cand.verdict END
  FROM cand LEFT JOIN upd ON upd.id = cand.id
 ORDER BY cand.id;

-- name: ReminderStates
-- The state of each named reminder, to explain the IDs a replay did not select.
SELECT r.id, coalesce(s.state, 'pending')
  FROM reminders r
  LEFT JOIN reminder_state s ON s.id = r.id
 WHERE r.id = ANY(@ids::bigint[]);

-- name: DeadLetterRows
-- The rows dead letters point at, read when the queue is read.
SELECT id, tenant, channel, state, fence, deadline, attempts, purged_at IS NOT NULL, coalesce(reason, '')
  FROM reminder_state
 WHERE id = ANY(@ids::bigint[]);

-- name: DLQReplay
-- Reminders whose dead letters an operator replays go back to pending under a
-- new fence (the dispatcher publishes them again), if they still have the
-- fence the operator saw, their deadline leaves the margin and their payload
-- is there: quarantined ones, and enqueued or retrying ones still waiting for
-- the dead letter itself (the fence is the message's, so no newer copy was
-- published: without a replay they would wait for the reconciler's overdue
-- republish).
WITH m AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[]) AS m(id, fence)
), cur AS (
    SELECT s.id, s.state AS old_state, m.fence FROM m JOIN reminder_state s ON s.id = m.id
), upd AS (
    UPDATE reminder_state s
       SET state = 'pending', fence = s.fence + 1, lease_until = NULL, next_attempt_at = NULL,
           enqueued_at = NULL, reason = NULL, updated_at = @now,
           attempts = CASE WHEN @reset_attempts::boolean THEN 0 ELSE s.attempts END,
           republishes = CASE WHEN @reset_attempts::boolean THEN 0 ELSE s.republishes END
      FROM cur
     WHERE s.id = cur.id AND s.fence = cur.fence AND (s.state IN ('quarantined', 'enqueued', 'retrying')) IS TRUE
       AND s.deadline > @min_deadline AND s.purged_at IS NULL
 RETURNING s.id, cur.old_state, s.fence
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, 'pending', fence, @actor, 'dlq_replayed', @reason, @now FROM upd
)
SELECT id FROM upd;

-- name: DLQExpire
-- Reminders whose dead letters an operator expires end as expired, if they
-- still have the fence the operator saw: quarantined ones, and enqueued or
-- retrying ones still waiting for the dead letter itself.
WITH m AS (
    SELECT * FROM unnest(@ids::bigint[], @fences::bigint[]) AS m(id, fence)
), cur AS (
    SELECT s.id, s.state AS old_state, m.fence FROM m JOIN reminder_state s ON s.id = m.id
), upd AS (
    UPDATE reminder_state s
       SET state = 'expired', fence = s.fence + 1, lease_until = NULL, next_attempt_at = NULL,
           reason = @reason, finished_at = @now, updated_at = @now
      FROM cur
     WHERE s.id = cur.id AND s.fence = cur.fence AND (s.state IN ('quarantined', 'enqueued', 'retrying')) IS TRUE
 RETURNING s.id, cur.old_state, s.fence
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, old_state, 'expired', fence, @actor, 'dlq_expired', @reason, @now FROM upd
)
SELECT id FROM upd;

-- name: Audit
-- One row per dead-letter message an operator acknowledged.
INSERT INTO operator_audit (at, actor, action, channel, reminder_id, message_id, reason, detail)
SELECT @now, @actor, a.action, @channel, nullif(a.reminder_id, 0), nullif(a.message_id, ''), @reason, a.detail
  FROM unnest(@actions::text[], @reminder_ids::bigint[], @message_ids::text[], @details::jsonb[])
       AS a(action, reminder_id, message_id, detail);

-- name: NoteDropped
-- A dlq_dropped note (reminder.Notes: not a transition) in the timeline of
-- each existing reminder whose stale dead letter a decision dropped, with the
-- decision's reason and the verdict's detail: from_state = to_state = its
-- state, at its fence. Writes no reminders nor reminder_state.
INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
SELECT s.id, s.state, s.state, s.fence, @actor, 'dlq_dropped', @reason || ' (' || d.detail || ')', @now
  FROM unnest(@ids::bigint[], @details::text[]) AS d(id, detail)
  JOIN reminder_state s ON s.id = d.id;

-- name: StatsCounts
-- Counts by channel × state and by tenant × state, in one scan of the state
-- rows, the reminders without one counted as pending. Its cost grows with the
-- table (every state row, retention's history included, and every lazy
-- reminder not yet promoted): nudgectl stats --exact, or tables below
-- ops.ExactCountsUpToPages (StatsPages).
SELECT grouping(channel, tenant), coalesce(channel, ''), coalesce(tenant, ''), state, sum(n)::bigint
  FROM (SELECT channel, tenant, state, count(*) AS n FROM reminder_state GROUP BY 1, 2, 3
        UNION ALL
        SELECT u.channel, u.tenant, 'pending', u.n FROM nudge_unpromoted_due('infinity') u) c
 GROUP BY GROUPING SETS ((channel, state), (tenant, state));

-- name: StatsCountsBounded
-- StatsCounts at a cost bounded by the work and a sample, not by the table
-- (issue 18). Exact: what is work, each over the partial index that holds
-- it, as the scrape reads it (internal/metrics DBGauges): the pending
-- reminders due by @now (the dispatcher's backlog: state rows, and the lazy
-- ones due without a state row, read from the promoter's provisional end,
-- bounded by its lag, as StatsAges reads them) and every in-flight state (a
-- sending row always holds a send lease: the leases index).
-- Estimated from a sample of pages (TABLESAMPLE SYSTEM: each page read with
-- probability @state_pct or @lazy_pct percent, so about as many pages
-- whatever the table's size): the pending state rows due later and the
-- terminal history (from reminder_state), and the lazy reminders due later
-- without a state row (from reminders: a primary-key probe of reminder_state
-- for each sampled lazy one due at or after the promoter's final watermark).
-- A sampled count is scaled by the relation's pages (@state_pages,
-- @lazy_pages) over the distinct pages the sample saw (a ratio: the number
-- of pages SYSTEM selects varies, the rows a page holds much less), or not
-- at all when the whole relation was read (pct 100). Pages without a live
-- row are never seen, so the estimate is high by their share. The sample is
-- REPEATABLE with a fixed seed: the same pages every call while the
-- relation keeps its size, so a console refreshing every 15 seconds finds
-- them in the cache and its figures do not jump between refreshes.
WITH unpromoted AS MATERIALIZED (
    SELECT u.channel, u.tenant, u.n FROM nudge_unpromoted_due(@now) u
), state_sample AS MATERIALIZED (
    SELECT channel, tenant, state, due_at, (ctid::text::point)[0] AS page
      FROM reminder_state TABLESAMPLE SYSTEM (@state_pct::float8) REPEATABLE (18)
), lazy_sample AS MATERIALIZED (
    SELECT r.channel, r.tenant, (r.ctid::text::point)[0] AS page,
           CASE WHEN r.lazy AND r.due_at > @now AND r.due_at >= (SELECT p.final_until FROM nudge_promoter p)
                THEN (SELECT true FROM reminder_state s WHERE s.id = r.id) IS NULL
                ELSE false END AS unpromoted
      FROM reminders r TABLESAMPLE SYSTEM (@lazy_pct::float8) REPEATABLE (18)
), scale AS (
    SELECT CASE WHEN @state_pct::float8 >= 100 THEN 1
                ELSE @state_pages::float8 / greatest((SELECT count(DISTINCT page) FROM state_sample), 1) END AS state,
           CASE WHEN @lazy_pct::float8 >= 100 THEN 1
                ELSE @lazy_pages::float8 / greatest((SELECT count(DISTINCT page) FROM lazy_sample), 1) END AS lazy
), c AS (
    SELECT channel, tenant, 'pending' AS state, count(*)::float8 AS n
      FROM reminder_state WHERE state = 'pending' AND due_at <= @now GROUP BY 1, 2
    UNION ALL
    SELECT channel, tenant, 'pending', n FROM unpromoted
    UNION ALL
    SELECT channel, tenant, state, count(*)
      FROM reminder_state WHERE state IN ('leased', 'retrying', 'quarantined') GROUP BY 1, 2, 3
    UNION ALL
    SELECT channel, tenant, 'enqueued', count(*) FROM reminder_state WHERE state = 'enqueued' GROUP BY 1, 2
    UNION ALL
    SELECT channel, tenant, 'sending', count(*)
      FROM reminder_state WHERE state = 'sending' AND lease_until IS NOT NULL GROUP BY 1, 2
    UNION ALL
    SELECT channel, tenant, state, count(*) * (SELECT state FROM scale)
      FROM state_sample
     WHERE (state = 'pending' AND due_at > @now) OR state IN ('delivered', 'failed', 'expired', 'canceled')
     GROUP BY 1, 2, 3
    UNION ALL
    SELECT channel, tenant, 'pending', count(*) * (SELECT lazy FROM scale)
      FROM lazy_sample WHERE unpromoted GROUP BY 1, 2
)
SELECT grouping(channel, tenant), coalesce(channel, ''), coalesce(tenant, ''), state, round(sum(n))::bigint
  FROM c
 GROUP BY GROUPING SETS ((channel, state), (tenant, state));

-- name: StatsPages
-- The current size in pages of reminder_state and of reminders (not
-- relpages, which waits for VACUUM or ANALYZE; a stat of the files, no row
-- read): ReadStats counts exactly (StatsCounts) while reminders is small,
-- and sizes StatsCountsBounded's sample from them.
SELECT pg_relation_size('reminder_state') / current_setting('block_size')::int,
       pg_relation_size('reminders') / current_setting('block_size')::int;

-- name: StatsAges
-- The newest intent (the primary key's end), then the oldest waiting work,
-- each from its own small partial index: pending and due, enqueued (waiting
-- for a worker), retrying past its next attempt, open past its deadline and
-- not yet expired, and past a lease (dispatch or send) not yet resolved.
-- The creation time is the wide row's (reminders' primary key); the rest is
-- reminder_state's, and the oldest due and unexpired ones also those of the
-- reminders due by now without a state row (a lagging promoter shows as age).
WITH unpromoted AS MATERIALIZED (
    SELECT min(u.oldest) AS due, min(u.oldest_deadline) AS deadline FROM nudge_unpromoted_due(@now) u
)
SELECT (SELECT created_at FROM reminders ORDER BY id DESC LIMIT 1),
       least((SELECT min(due_at) FROM reminder_state WHERE state = 'pending' AND due_at <= @now),
             (SELECT due FROM unpromoted)),
       (SELECT min(enqueued_at) FROM reminder_state WHERE state = 'enqueued'),
       (SELECT min(next_attempt_at) FROM reminder_state WHERE state = 'retrying' AND next_attempt_at <= @now),
       least((SELECT min(deadline) FROM reminder_state
               WHERE deadline <= @now
                 AND state COLLATE "C" IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')),
             (SELECT deadline FROM unpromoted)),
       (SELECT min(lease_until) FROM reminder_state
         WHERE state IN ('leased', 'enqueued', 'sending') AND lease_until <= @now);

-- name: StatsWindows
-- Deadline misses (reminders that expired, not counting an operator's expiry
-- of a dead letter) and quarantines (each one put a message in a dead-letter
-- queue) in the last hour and day, by channel.
SELECT channel, 'expired', count(*) FILTER (WHERE finished_at >= @hour_ago), count(*)
  FROM reminder_state
 WHERE state = 'expired' AND finished_at >= @day_ago AND finished_at <= @now
   AND coalesce(reason, '') NOT LIKE 'dlq expire: %'
 GROUP BY channel
UNION ALL
SELECT s.channel, 'quarantined', count(*) FILTER (WHERE e.at >= @hour_ago), count(*)
  FROM reminder_events e JOIN reminder_state s ON s.id = e.reminder_id
 WHERE e.to_state = 'quarantined' AND e.at >= @day_ago AND e.at <= @now
   AND e.from_state IS DISTINCT FROM e.to_state -- not a note (reminder.Notes)
 GROUP BY s.channel;

-- name: StatsRecent
-- Terminal outcomes of the recent window (@since, @now], by channel: the
-- rate workers (and expiries) produce terminal records now, not all-time
-- totals. The terminal indexes, on the same expression, bound the read to the
-- window: the unpurged rows' and the purged rows' (schema 47; each terminal
-- row is in exactly one, and a row finished in the window is rarely purged).
SELECT channel, state, count(*)
  FROM (SELECT channel, state FROM reminder_state
         WHERE purged_at IS NULL AND state IN ('delivered', 'failed', 'expired', 'canceled')
           AND coalesce(finished_at, updated_at) > @since AND coalesce(finished_at, updated_at) <= @now
        UNION ALL
        SELECT channel, state FROM reminder_state
         WHERE purged_at IS NOT NULL AND state IN ('delivered', 'failed', 'expired', 'canceled')
           AND coalesce(finished_at, updated_at) > @since AND coalesce(finished_at, updated_at) <= @now) t
 GROUP BY channel, state;

-- name: StatsDispatch
-- The dispatcher's heartbeat: the cutoff of the newest run that finished
-- everything due before it (no error, budget not exhausted), and the newest
-- run of any kind.
SELECT max(cutoff) FILTER (WHERE error IS NULL AND NOT out_of_budget), max(finished_at), count(*)
  FROM dispatch_runs
 WHERE finished_at >= @since;

-- name: StatsLastClaim
-- Fallback when no dispatcher records its runs: the newest claim among the
-- newest 100,000 events (a backward walk of the primary key, so it stays
-- cheap however large the table is), by its code. Events written before
-- schema version 9 (or by a dispatcher of version 8 still running during the
-- rollout) have no code: for those, the claim's reason text as version 8
-- wrote it. Claims folded into their rows (schema version 30) are read from
-- the work in flight and the newest 100,000 terminal rows, over the partial
-- indexes that hold them (reminder_state_enqueued, _leases, _parked,
-- _terminal_unpurged and _terminal_purged): bounded by the work, not the
-- table. The newest terminal rows are the unpurged ones (retention purges
-- the oldest first), so the purged are read only when fewer than 100,000
-- rows are unpurged, to make up the number: the Append runs its parts in
-- order and the LIMIT stops it (no ORDER BY over the two: a merge would
-- start both parts, and on a schema before 47 the purged part's first row
-- lies past every unpurged one in reminder_state_terminal).
-- A folded claim of a row since returned to pending is not among them (a
-- newer claim almost always is).
SELECT at FROM (
    (SELECT at FROM reminder_events
      WHERE id > (SELECT coalesce(max(id), 0) FROM reminder_events) - 100000
        AND (code = 'claimed' OR (code IS NULL AND reason = 'claimed for dispatch'))
      ORDER BY id DESC
      LIMIT 1)
    UNION ALL
    SELECT max(claimed_at) FROM reminder_state WHERE state = 'enqueued'
    UNION ALL
    -- a sending row always holds its send lease: stated, so the planner reads
    -- reminder_state_leases (its predicate) rather than the whole table
    SELECT max(claimed_at) FROM reminder_state WHERE state = 'sending' AND lease_until IS NOT NULL
    UNION ALL
    SELECT max(claimed_at) FROM reminder_state WHERE state IN ('leased', 'retrying', 'quarantined')
    UNION ALL
    SELECT max(t.claimed_at) FROM (
        (SELECT claimed_at FROM reminder_state
          WHERE purged_at IS NULL AND state IN ('delivered', 'failed', 'expired', 'canceled')
          ORDER BY coalesce(finished_at, updated_at) DESC
          LIMIT 100000)
        UNION ALL
        (SELECT claimed_at FROM reminder_state
          WHERE purged_at IS NOT NULL AND state IN ('delivered', 'failed', 'expired', 'canceled')
          ORDER BY coalesce(finished_at, updated_at) DESC
          LIMIT 100000)
        LIMIT 100000) t
) c
 WHERE at IS NOT NULL
 ORDER BY at DESC
 LIMIT 1;

-- name: PublishOf
-- A reminder's current dispatch batch and, when the dispatcher recorded it,
-- that batch's publish confirmation (recorded per batch since schema
-- version 7, so it is not among the reminder's events). None for a
-- reminder without a state row yet.
SELECT s.dispatch_batch, c.confirmed_at, coalesce(c.actor, '')
  FROM reminders r
  LEFT JOIN reminder_state s ON s.id = r.id
  LEFT JOIN publish_confirms c ON c.batch = s.dispatch_batch
 WHERE r.id = @id;

-- name: ListIDs
-- The IDs of the reminders a filter selects, newest first, after the keyset
-- cursor @before (0: from the newest), at most @limit. nudgectl list, its
-- bulk actions and the console page and count with it (never OFFSET). Every
-- condition is off when its parameter is empty. Late: due at or before @now
-- and not terminal. The reason matches the row's reason or last error.
-- A walk of reminder_state's primary key, backwards; the key, which only the
-- wide row has, is read from it (by primary key) only when a key prefix is
-- asked for. Only for a filter that excludes pending (ops.Filter's
-- IncludesPending): a reminder without a state row is pending, and
-- ListIDsAll finds it.
SELECT s.id
  FROM reminder_state s
 WHERE (@before::bigint = 0 OR s.id < @before::bigint)
   AND (coalesce(cardinality(@ids::bigint[]), 0) = 0 OR s.id = ANY(@ids::bigint[]))
   AND (@tenant::text = '' OR s.tenant = @tenant::text)
   AND (coalesce(cardinality(@states::text[]), 0) = 0 OR s.state = ANY(@states::text[]))
   AND (@channel::text = '' OR s.channel = @channel::text)
   AND (@key_prefix::text = ''
        OR (SELECT left(r.key, length(@key_prefix::text)) FROM reminders r WHERE r.id = s.id) = @key_prefix::text)
   AND (@due_from::timestamptz IS NULL OR s.due_at >= @due_from::timestamptz)
   AND (@due_to::timestamptz IS NULL OR s.due_at < @due_to::timestamptz)
   AND (@deadline_from::timestamptz IS NULL OR s.deadline >= @deadline_from::timestamptz)
   AND (@deadline_to::timestamptz IS NULL OR s.deadline < @deadline_to::timestamptz)
   AND (NOT @late::boolean
        OR (s.due_at <= @now AND s.state NOT IN ('delivered', 'failed', 'expired', 'canceled')))
   AND (@reason::text = ''
        OR strpos(lower(coalesce(s.reason, '') || E'\n' || coalesce(s.last_error, '')), lower(@reason::text)) > 0)
 ORDER BY s.id DESC
 LIMIT @limit;

-- name: ListIDsAll
-- ListIDs for a filter that may select pending reminders: a walk of
-- reminders' primary key, backwards, each one's state row by primary key;
-- without one it is pending, its times the wide row's.
SELECT r.id
  FROM reminders r
  LEFT JOIN reminder_state s ON s.id = r.id
 WHERE (@before::bigint = 0 OR r.id < @before::bigint)
   AND (coalesce(cardinality(@ids::bigint[]), 0) = 0 OR r.id = ANY(@ids::bigint[]))
   AND (@tenant::text = '' OR r.tenant = @tenant::text)
   AND (coalesce(cardinality(@states::text[]), 0) = 0 OR coalesce(s.state, 'pending') = ANY(@states::text[]))
   AND (@channel::text = '' OR r.channel = @channel::text)
   AND (@key_prefix::text = '' OR left(r.key, length(@key_prefix::text)) = @key_prefix::text)
   AND (@due_from::timestamptz IS NULL OR coalesce(s.due_at, r.due_at) >= @due_from::timestamptz)
   AND (@due_to::timestamptz IS NULL OR coalesce(s.due_at, r.due_at) < @due_to::timestamptz)
   AND (@deadline_from::timestamptz IS NULL OR coalesce(s.deadline, r.deadline) >= @deadline_from::timestamptz)
   AND (@deadline_to::timestamptz IS NULL OR coalesce(s.deadline, r.deadline) < @deadline_to::timestamptz)
   AND (NOT @late::boolean
        OR (coalesce(s.due_at, r.due_at) <= @now
            AND coalesce(s.state, 'pending') NOT IN ('delivered', 'failed', 'expired', 'canceled')))
   AND (@reason::text = ''
        OR strpos(lower(coalesce(s.reason, '') || E'\n' || coalesce(s.last_error, '')), lower(@reason::text)) > 0)
 ORDER BY r.id DESC
 LIMIT @limit;

-- name: ListRows
-- The listed reminders' columns, newest first: the state row's, and the key,
-- recipient, template and creation time of the wide row (by primary key).
-- Without a state row: pending, fence 0, the wide row's intent.
SELECT r.id, r.tenant, r.key, r.channel, r.recipient, r.template, coalesce(s.state, 'pending'),
       coalesce(s.fence, 0), coalesce(s.due_at, r.due_at), coalesce(s.deadline, r.deadline),
       coalesce(s.attempts, 0), coalesce(s.reason, ''), coalesce(s.last_error, ''), r.created_at,
       coalesce(s.updated_at, r.created_at), s.finished_at, s.purged_at IS NOT NULL,
       coalesce(CASE WHEN s.id IS NULL THEN r.tz ELSE s.tz END, '')
  FROM reminders r
  LEFT JOIN reminder_state s ON s.id = r.id
 WHERE r.id = ANY(@ids::bigint[])
 ORDER BY r.id DESC;

-- name: Attempts
-- A reminder's delivery attempts, oldest first.
SELECT attempt, fence, worker, started_at, finished_at, coalesce(outcome, ''),
       coalesce(provider_message_id, ''), coalesce(error, '')
  FROM delivery_attempts
 WHERE reminder_id = @id
 ORDER BY id;

-- name: Minutes
-- The last hour minute by minute, from the newest @scan events (a backward
-- walk of the primary key: bounded however large the table is): reminders
-- scheduled (is intent written), claimed by the dispatcher (is it advancing),
-- attempts started by workers (is the queue draining), terminal outcomes (are
-- workers finishing) and quarantines. ago is whole minutes before @now.
-- The happy path's events folded into their rows (schema version 30: claim,
-- first attempt, delivery) are counted from the rows a move of the last
-- hour can be folded into: the work in flight and the rows finished in the
-- last hour (a claim or an attempt precedes the finish), each part over the
-- partial index that holds it (the finished rows: the unpurged and the
-- purged rows' indexes, schema 47), so bounded by the work, not the table.
-- A folded claim of a row since returned to pending is not counted.
WITH folded AS (
    SELECT claimed_at, started_at, NULL::timestamptz AS delivered_at FROM reminder_state WHERE state = 'enqueued'
    UNION ALL
    -- a sending row always holds its send lease (as in StatsLastClaim)
    SELECT claimed_at, started_at, NULL FROM reminder_state WHERE state = 'sending' AND lease_until IS NOT NULL
    UNION ALL
    SELECT claimed_at, started_at, NULL FROM reminder_state WHERE state IN ('leased', 'retrying', 'quarantined')
    UNION ALL
    SELECT claimed_at, started_at, CASE WHEN delivered_by IS NOT NULL THEN finished_at END
      FROM reminder_state
     WHERE purged_at IS NULL AND state IN ('delivered', 'failed', 'expired', 'canceled')
       AND coalesce(finished_at, updated_at) > @now::timestamptz - interval '1 hour'
    UNION ALL
    SELECT claimed_at, started_at, CASE WHEN delivered_by IS NOT NULL THEN finished_at END
      FROM reminder_state
     WHERE purged_at IS NOT NULL AND state IN ('delivered', 'failed', 'expired', 'canceled')
       AND coalesce(finished_at, updated_at) > @now::timestamptz - interval '1 hour'
), moves AS (
    SELECT e.at,
           (e.from_state IS NULL AND e.to_state = 'pending')::int AS scheduled,
           coalesce(e.code = 'claimed' OR (e.code IS NULL AND e.reason = 'claimed for dispatch'), false)::int AS claimed,
           (e.to_state = 'sending')::int AS started,
           (e.to_state IN ('delivered', 'failed', 'expired', 'canceled'))::int AS terminal,
           (e.to_state = 'quarantined')::int AS quarantined
      FROM reminder_events e
     WHERE e.id > (SELECT coalesce(max(id), 0) FROM reminder_events) - @scan
       -- Notes (reminder.Notes: a dead letter, a dropped one) are not
       -- transitions: their from_state = to_state. No transition counted here
       -- keeps its state (pending → pending on a closed window is not counted).
       AND e.from_state IS DISTINCT FROM e.to_state
    UNION ALL
    SELECT claimed_at, 0, 1, 0, 0, 0 FROM folded WHERE claimed_at IS NOT NULL
    UNION ALL
    SELECT started_at, 0, 0, 1, 0, 0 FROM folded WHERE started_at IS NOT NULL
    UNION ALL
    SELECT delivered_at, 0, 0, 0, 1, 0 FROM folded WHERE delivered_at IS NOT NULL
)
SELECT floor(extract(epoch FROM (@now::timestamptz - m.at)) / 60)::int AS ago,
       sum(m.scheduled), sum(m.claimed), sum(m.started), sum(m.terminal), sum(m.quarantined)
  FROM moves m
 WHERE m.at > @now::timestamptz - interval '1 hour' AND m.at <= @now::timestamptz
 GROUP BY 1;
