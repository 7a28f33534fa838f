-- What the reconciler's collectors read at scrape time. Each statement reads
-- small indexes only: a scrape must stay cheap however big the table grows.
-- Time comes from the caller (@now).

-- name: DBGauges
-- The gauges DBCollector derives. Each part reads a range of a partial index
-- of reminder_state (schema 32: the state rows, no payload) that holds work,
-- not history or the future: the pending-due index up to
-- @now, the enqueued index, the expiry index up to @now (schema 42), the leases
-- index up to @now, the in-flight states over the parked index (0027: leased,
-- retrying, quarantined), the enqueued index and the leases index (a sending
-- row always holds a send lease), the expired index over the
-- last hour and the dispatch runs' own; the newest reminder is the primary
-- key's end (of reminders: the creation time is the wide row's). Pending
-- reminders are counted once due: those scheduled for
-- later are only estimated, from the pending-due index's reltuples (as of
-- the last VACUUM or ANALYZE; -1 before either), so a table of reminders
-- scheduled months ahead costs a scrape nothing. The estimate is
-- reminder_state's once that table has been vacuumed or analyzed, and until
-- then that of reminders' own pending-due index (while it exists: the
-- release that drops the state columns of reminders drops it too).
-- A reminder due by @now without a state row yet (the promoter inserts it,
-- schema 39) is pending: nudge_unpromoted_due adds it to the oldest due
-- reminder, the oldest open deadline and the pending counts, so a lagging
-- promoter shows as age, the first alert. It reads from the promoter's
-- provisional end in due order, a primary-key probe per reminder, and stops
-- after @unpromoted_limit without a state row (schema 43): the oldest due is
-- exact, the pending count of a lagging promoter's reminders is at least
-- what it read, the oldest deadline is the oldest among them.
WITH unpromoted AS MATERIALIZED (
    SELECT u.channel, u.n, u.oldest, u.oldest_deadline FROM nudge_unpromoted_due(@now, @unpromoted_limit) u
)
SELECT least((SELECT min(due_at) FROM reminder_state WHERE state = 'pending' AND due_at <= @now),
             (SELECT min(oldest) FROM unpromoted)),
       (SELECT min(enqueued_at) FROM reminder_state WHERE state = 'enqueued'),
       least((SELECT min(deadline) FROM reminder_state
               WHERE deadline <= @now
                 AND state COLLATE "C" IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined')),
             (SELECT min(oldest_deadline) FROM unpromoted)),
       (SELECT min(lease_until) FROM reminder_state
         WHERE state IN ('leased', 'enqueued', 'sending') AND lease_until <= @now),
       (SELECT cutoff FROM dispatch_runs WHERE error IS NULL AND NOT out_of_budget
         ORDER BY finished_at DESC LIMIT 1),
       (SELECT coalesce(jsonb_object_agg(channel || '/' || state, n), '{}'::jsonb)
          FROM (SELECT p.channel, 'pending' AS state, sum(p.n)::bigint AS n
                  FROM (SELECT channel, count(*) AS n FROM reminder_state
                         WHERE state = 'pending' AND due_at <= @now
                         GROUP BY 1
                        UNION ALL
                        SELECT channel, n FROM unpromoted) p
                 GROUP BY 1
                UNION ALL
                SELECT channel, state, count(*) FROM reminder_state
                 WHERE state IN ('leased', 'retrying', 'quarantined')
                 GROUP BY 1, 2
                UNION ALL
                SELECT channel, 'enqueued', count(*) FROM reminder_state
                 WHERE state = 'enqueued'
                 GROUP BY 1
                UNION ALL
                SELECT channel, 'sending', count(*) FROM reminder_state
                 WHERE state = 'sending' AND lease_until IS NOT NULL
                 GROUP BY 1) o),
       (SELECT coalesce(jsonb_object_agg(channel, n), '{}'::jsonb)
          FROM (SELECT channel, count(*) AS n FROM reminder_state
                 WHERE state = 'expired' AND finished_at > @hour_ago AND finished_at <= @now
                   AND coalesce(reason, '') NOT LIKE 'dlq expire: %'
                 GROUP BY 1) m),
       (SELECT created_at FROM reminders ORDER BY id DESC LIMIT 1),
       coalesce((SELECT i.reltuples FROM pg_class t, pg_class i
                  WHERE t.oid = to_regclass('reminder_state') AND t.reltuples >= 0
                    AND i.oid = to_regclass('reminder_state_pending_due')),
                (SELECT reltuples FROM pg_class WHERE oid = to_regclass('reminders_pending_due')),
                (SELECT reltuples FROM pg_class WHERE oid = to_regclass('reminder_state_pending_due')));

-- name: PromoterGauges
-- The due-ordered store's promoter (schema 38), from its one watermark row:
-- its lag (@now + H of its last pass − its provisional end: the last
-- complete sweep's end, or the cursor of the sweep in progress when
-- farther) and the final watermark. Absent before a pass ran.
SELECT @now::timestamptz + p.ahead - greatest(p.prov_until, p.cursor_due), p.final_until
  FROM nudge_promoter p
 WHERE p.passed_at IS NOT NULL;

-- name: OldestTransaction
-- How long the oldest transaction open on this database has been open
-- (interval 0 when none). While it holds a snapshot or has written, vacuum
-- cannot remove the row versions that died since it began: the claim steps
-- over ever more dead entries of reminder_state_claim, and a writer on
-- reminders keeps the promoter's final watermark where it was. Any open
-- transaction counts, a read-committed one between statements too (it
-- holds its locks, and its next statement takes a snapshot): the age is
-- what the operator acts on, the runbook tells the kinds apart.
-- This database only (datname = current_database()): from PostgreSQL 14
-- only sessions of the same database hold back the horizon of its tables
-- (another database's hold only the shared catalogs'; checked on 15: a
-- transaction open on another database left VACUUM free to remove this
-- one's dead rows), and the promoter waits only for writers on reminders;
-- on 12 and 13 another database's transaction also stops pruning (not
-- vacuum), which this misses.
-- Client backends only (autovacuum, walsenders and the like are not the
-- application's), not the scrape's own (its age is this statement's), and
-- not idle ones (no transaction), nor aborted ones (xact_start NULL: an
-- aborted transaction has released its snapshot and locks). Unless the
-- login has pg_read_all_stats (pg_monitor includes it), another role's row
-- shows NULL database, backend type, state and xact_start: the conditions
-- drop it, so without the grant the gauge sees the reconciler's own
-- sessions only (docs/deploy.md, "Reading other sessions").
-- Time is the database's (statement_timestamp(), not @now): xact_start is
-- its clock, and a caller's clock, a test's fake one included, is not.
-- Cost: pg_stat_activity is one row per backend, bounded by
-- max_connections, never by any table's size.
-- The second column says whether the login reads every session (a
-- superuser, or a member of pg_read_all_stats): when it does not, the age
-- covers its own sessions only and reads 0 whatever another login holds
-- open, so the collector exports that too (nudge_db_activity_readable).
SELECT coalesce(statement_timestamp() - min(xact_start), interval '0'),
       pg_has_role('pg_read_all_stats', 'USAGE')
  FROM pg_stat_activity
 WHERE backend_type = 'client backend'
   AND datname = current_database()
   AND pid <> pg_backend_pid()
   AND state <> 'idle';

-- name: HasUnpromotedEstimate
-- Whether the schema has nudge_unpromoted_estimate (schema 44, the
-- after-rollout step that turns lazy intake on). Before it nothing is lazy,
-- and this release's reconciler runs there during the rollout.
SELECT to_regprocedure('nudge_unpromoted_estimate()') IS NOT NULL;

-- name: UnpromotedEstimate
-- The lazy reminders not yet promoted, which have no state row and so are
-- not in DBGauges' estimate of the reminders scheduled for later: the
-- planner's row estimate of the lazy reminders due at or after the final
-- watermark (schema 44), from statistics; no row of reminders is read.
SELECT nudge_unpromoted_estimate();

-- name: DispatchRunsStart
-- Where DispatchRunCollector starts: the newest run's id (its hops and those
-- before it are not counted), and the newest successful and any run's end
-- (the finished_at index, read backwards).
SELECT coalesce((SELECT max(id) FROM dispatch_runs), 0),
       (SELECT finished_at FROM dispatch_runs WHERE error IS NULL ORDER BY finished_at DESC LIMIT 1),
       (SELECT max(finished_at) FROM dispatch_runs);

-- name: DispatchRunsSince
-- The runs recorded after @after, by primary key.
SELECT id, finished_at, error IS NULL, hops
  FROM dispatch_runs
 WHERE id > @after
 ORDER BY id
 LIMIT @limit;

-- name: PlanningGauges
-- What PlanningCollector derives, over the campaigns still planning only
-- (campaigns_runnable, schema 26) and each one's newest checkpoint (the
-- primary key of campaign_slices, read backwards): the oldest wait for a
-- next slice, the oldest last checkpoint, and how many are planning.
SELECT (SELECT min(updated_at) FROM campaigns WHERE state = 'planning'),
       (SELECT min(coalesce((SELECT s.at FROM campaign_slices s
                               WHERE s.campaign_id = c.id ORDER BY s.slice DESC LIMIT 1), c.created_at))
          FROM campaigns c WHERE c.state = 'planning'),
       (SELECT count(*) FROM campaigns WHERE state = 'planning');
