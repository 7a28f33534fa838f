-- Schema version 43: the scrape's read of the reminders due without a state
-- row is bounded by a cap, not by the table nor by the promoter's lag (issue
-- 18; docs/benchmarks.md, "The promoter under a long web transaction" and
-- "The scrape's read of unpromoted reminders, bounded").
--
-- Schema 39's nudge_unpromoted_due(p_due_by) read the lazy reminders due
-- from the promoter's final watermark to p_due_by and dropped those with a
-- state row by NOT EXISTS. Once that range holds rows (final held back by a
-- long web transaction, or a dispatcher down for more than H), the planner
-- made the NOT EXISTS a hash anti join against a sequential scan of the
-- whole of reminder_state, retention's history included: a scrape at 1M went
-- from 6-14 ms to 107-175 ms, growing with the table.
--
-- Two changes, for finite p_due_by:
--
-- - The read starts at the promoter's provisional end, not at final: the
--   greatest of final_until, prov_until (the last complete sweep's end) and
--   cursor_due (the keyset cursor of the sweep in progress). Below it a sweep
--   has read every lazy reminder committed before its first pass and
--   inserted its state row; only the late commits of the writers that sweep
--   waited for (prov_wait, sweep_wait: a web transaction open across the
--   sweep) can lack one there, and the next sweep, which starts at final,
--   promotes them. So a long web transaction no longer widens the range
--   (it ends about H ahead of now, past p_due_by = now: empty), and a
--   dispatcher down widens it by the time it is down, which is what the
--   gauges must show. The price: a web transaction's reminders committed
--   late and already due are missed until the next dispatcher run promotes
--   them (then they are pending state rows, seen as before).
-- - Each reminder of the range is probed by reminder_state's primary key in
--   a scalar subquery, which the planner cannot turn into a join (a NOT
--   EXISTS it may hash, a scalar SubPlan it runs per row), in (due_at, id)
--   order over reminders_due_order.
--
-- nudge_unpromoted_due(p_due_by, p_limit) (new) stops after p_limit
-- reminders without a state row (NULL: no limit), read in due order: the
-- oldest due is exact, the counts by channel and tenant are "at least" when
-- their sum reaches p_limit, the oldest deadline is the oldest among those
-- read. The scrape (internal/metrics DBGauges) calls it with a cap, so it
-- reads at most about that many index entries and primary-key probes,
-- whatever the table and the lag.
--
-- nudge_unpromoted_due(p_due_by) keeps its signature and columns (release
-- N-1's binaries call it: their scrape and nudgectl stats): for a finite
-- p_due_by it is the above without a cap (bounded by the lag, not the
-- table: nudgectl stats' ages); for 'infinity' (nudgectl stats' counts,
-- every lazy reminder not yet promoted, due or not) it is schema 39's body
-- unchanged, from final, the planner's choice of join: StatsCounts reads
-- every state row in the same statement anyway, and a probe per row of
-- every reminder scheduled for later would cost more than that scan.
--
-- CREATE OR REPLACE keeps the one-argument function's grants (EXECUTE to
-- PUBLIC, as in 39); the new one is PUBLIC's too, like 39's. Nothing here
-- takes a lock on a table.

CREATE OR REPLACE FUNCTION nudge_unpromoted_due(p_due_by timestamptz, p_limit integer)
RETURNS TABLE (channel text, tenant text, n bigint, oldest timestamptz, oldest_deadline timestamptz)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE walk AS (
        SELECT f.due_at, f.id, f.channel, f.tenant, f.deadline, f.unpromoted, f.unpromoted::int AS k
          FROM (SELECT r.due_at, r.id, r.channel, r.tenant, r.deadline,
                       (SELECT true FROM reminder_state s WHERE s.id = r.id) IS NULL AS unpromoted
                  FROM reminders r
                 WHERE r.lazy
                   AND r.due_at >= (SELECT greatest(p.final_until, p.prov_until, p.cursor_due) FROM nudge_promoter p)
                   AND r.due_at <= p_due_by
                 ORDER BY r.due_at, r.id
                 LIMIT 1) f
        UNION ALL
        SELECT x.due_at, x.id, x.channel, x.tenant, x.deadline, x.unpromoted, w.k + x.unpromoted::int
          FROM walk w
          CROSS JOIN LATERAL (
               SELECT r.due_at, r.id, r.channel, r.tenant, r.deadline,
                      (SELECT true FROM reminder_state s WHERE s.id = r.id) IS NULL AS unpromoted
                 FROM reminders r
                WHERE r.lazy
                  AND (r.due_at, r.id) > (w.due_at, w.id)
                  AND r.due_at <= p_due_by
                ORDER BY r.due_at, r.id
                LIMIT 1) x
         WHERE p_limit IS NULL OR w.k < p_limit
    )
    SELECT w.channel, w.tenant, count(*), min(w.due_at), min(w.deadline) FILTER (WHERE w.deadline <= p_due_by)
      FROM walk w
     WHERE w.unpromoted
     GROUP BY w.channel, w.tenant;
$$;

CREATE OR REPLACE FUNCTION nudge_unpromoted_due(p_due_by timestamptz)
RETURNS TABLE (channel text, tenant text, n bigint, oldest timestamptz, oldest_deadline timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT r.channel, r.tenant, count(*), min(r.due_at), min(r.deadline) FILTER (WHERE r.deadline <= p_due_by)
      FROM reminders r
     WHERE p_due_by < 'infinity'
       AND r.lazy
       AND r.due_at >= (SELECT greatest(p.final_until, p.prov_until, p.cursor_due) FROM nudge_promoter p)
       AND r.due_at <= p_due_by
       AND (SELECT true FROM reminder_state s WHERE s.id = r.id) IS NULL
     GROUP BY r.channel, r.tenant
    UNION ALL
    SELECT r.channel, r.tenant, count(*), min(r.due_at), min(r.deadline) FILTER (WHERE r.deadline <= p_due_by)
      FROM reminders r
     WHERE p_due_by = 'infinity'
       AND r.lazy
       AND r.due_at >= (SELECT p.final_until FROM nudge_promoter p)
       AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)
     GROUP BY r.channel, r.tenant;
$$;
