-- Schema version 36: operator statements that layout A made slower, read
-- the way the narrow state row allows (issue 18, docs/benchmarks.md,
-- "Operator statements after layout A").
--
-- A regular migration, numbered after the after-rollout step (35), so it
-- runs once that step has run (schema.Plan: what follows a waiting step
-- waits too). CREATE OR REPLACE keeps the signature, the answers and the
-- grants: binaries of either release call it unchanged.
--
-- nudge_campaign_status counted a campaign's reminders by state index-only
-- over reminders_campaign_keys (state in INCLUDE) until 35 dropped it; since
-- 34 it walks reminders_keys for the campaign's key prefix and probes
-- reminder_state's primary key once per reminder: ~4 buffers a reminder
-- (204k for a campaign of 50k on the fixture of docs/benchmarks.md; 9.9k
-- read this way; 2.3k before layout A). The planner writes a
-- campaign's reminders a slice at a time (ScheduleMany, one INSERT of up to
-- 200 rows), so their ids come in runs of consecutive values. Here the ids
-- under the prefix are grouped into those runs (id - row_number() over the
-- ids in order is constant along a run) and each run is read from
-- reminder_state as one range of its primary key: a descent per run, then
-- the leaf pages and the rows in order. A range holds only the run's own
-- ids (every id between its ends is one of them), so the counts are those
-- of the join by id; ids that come singly (a slice interleaved with other
-- intake) cost a probe each, as before. No index is added: every index of
-- reminder_state takes an entry at each transition of the hot path.
CREATE OR REPLACE FUNCTION nudge_campaign_status(p_tenant text, p_id bigint)
RETURNS TABLE (state text, planned bigint, bad bigint, slices bigint, last_checkpoint timestamptz,
               unplanned bigint, late_slices bigint, deadline timestamptz, deliveries jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    RETURN QUERY
    SELECT c.state, c.planned, c.bad, c.fence,
           (SELECT cs.at FROM campaign_slices cs WHERE cs.campaign_id = c.id ORDER BY cs.slice DESC LIMIT 1),
           c.unplanned,
           -- In the campaign's slice size (NULL from schema 25 on: the
           -- planner's; then its largest slice so far, or 200).
           (SELECT CASE WHEN c.state = 'late' THEN (coalesce(c.unplanned, 0) + z.size - 1) / z.size ELSE 0 END
              FROM (SELECT coalesce(c.slice_size, (SELECT max(cs.rows_read) FROM campaign_slices cs
                                                    WHERE cs.campaign_id = c.id), 200) AS size) z)::bigint,
           c.deadline,
           (SELECT coalesce(jsonb_object_agg(d.state, d.n), '{}'::jsonb)
              FROM (SELECT s.state, count(*) AS n
                      FROM (SELECT min(k.id) AS lo, max(k.id) AS hi
                              FROM (SELECT r.id, r.id - row_number() OVER (ORDER BY r.id) AS run
                                      FROM reminders r
                                     WHERE r.tenant = c.tenant AND r.key LIKE 'campaign:%'
                                       AND r.key ~>=~ ('campaign:' || c.id || ':')
                                       AND r.key ~<~ ('campaign:' || c.id || ';')) k
                             GROUP BY k.run) runs
                      JOIN LATERAL (SELECT s.state FROM reminder_state s
                                     WHERE s.id BETWEEN runs.lo AND runs.hi) s ON true
                     GROUP BY s.state) d)
      FROM campaigns c
     WHERE c.id = p_id AND c.tenant = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'nudge: tenant % has no campaign %', quote_literal(p_tenant), p_id USING ERRCODE = 'P0002';
    END IF;
END $$;

-- CREATE OR REPLACE kept the grants but not the settings: pinned to this
-- schema again.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION nudge_campaign_status(text, bigint) SET search_path = %I, pg_temp', current_schema());
END $$;

-- A replay of failed and quarantined reminders (internal/ops Replay) with
-- a tenant filter found the tenant's candidates until 35 by BitmapAnd of
-- reminders_replayable and reminders_logical_key (tenant, key); since 32 the
-- candidates are reminder_state_replayable's, which has no tenant, so the
-- statement read the row of every failed and quarantined reminder of every
-- tenant to keep the tenant's (6,916 buffers on a table of 400k, 1,136
-- before layout A, 942 with this index). The same partial index with the tenant as its second column
-- answers a tenant's candidates in the index (a due window still bounds its
-- first column). It replaces the old one: the same predicate, so the same
-- entries, each a few bytes wider. Its predicate names only failed and
-- quarantined, so a transition enters it only when it writes one of those
-- states (as the old one), never on the way to delivered: the delivery hot
-- path writes no more than before.
--
-- The old index goes first. DROP INDEX takes reminder_state's ACCESS
-- EXCLUSIVE lock, CREATE INDEX its SHARE lock: built first, the index would
-- hold SHARE (which lets the running fleet's transactions read the table)
-- and then wait to upgrade it while a fleet transaction that had read the
-- table waits on the SHARE lock to write it: a deadlock, which
-- TestRollingUpgrade met. Taking the strongest lock first, before any other
-- lock on a table (the function above takes none),
-- leaves nothing to upgrade. It holds the fleet's statements on the table
-- back while the index builds (seconds per million rows): a large install
-- builds it first with CREATE INDEX CONCURRENTLY and the same definition
-- (docs/deploy.md, Upgrades), which IF NOT EXISTS then keeps.
DROP INDEX IF EXISTS reminder_state_replayable;
CREATE INDEX IF NOT EXISTS reminder_state_replayable_tenant ON reminder_state (due_at, tenant)
    WHERE state IN ('failed', 'quarantined');
