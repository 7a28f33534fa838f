-- Nudge schema, version 27: no index entry for the happy path that only a
-- rare query reads (issue 12: the dispatcher's regression since version 14).
--
-- Every change of state rewrites the reminder's row as a new tuple (state is
-- in partial index predicates, so no update is HOT), and a new tuple gets an
-- entry in every index whose predicate it matches. Versions 14 and 23 added
-- two partial indexes whose predicates hold enqueued and sending rows, so a
-- delivered reminder (pending -> enqueued -> sending -> delivered) paid four
-- more index insertions for them, two in the dispatcher's claim: per claimed
-- row 2 more WAL records (~170 bytes) and ~10 more shared buffers touched
-- (reminders_open_keys' insertions also run bottom-up deletion over the
-- versions of the same key). Both serve queries that can find enqueued and
-- sending rows elsewhere, over indexes the happy path fills anyway and that
-- hold only the work in flight:
--
--   reminders_open_keys (0014): nudge_cancel_prefix and CountPrefix, by key
--   prefix. Now reminders_waiting_keys, without enqueued and sending rows;
--   those are found over reminders_enqueued and reminders_leases (a sending
--   row always holds a send lease: ClaimForDelivery, the only way in, sets it).
--   reminders_in_flight (0023): the metrics scrape's count by channel and
--   state. Now reminders_parked, for the states off the happy path (leased,
--   retrying, quarantined); enqueued and sending rows are counted over
--   reminders_enqueued and reminders_leases.
--
-- Rolling upgrade: dispatchers and workers of any version are unaffected.
-- nudge_cancel_prefix is replaced here, for every caller at once. Until they
-- are replaced, binaries of versions 14-26 still run their own CountPrefix
-- (nudgectl cancel-prefix's count) and reconcilers of versions 23-26 their
-- metrics scrape with the old state lists, which no index now covers: correct,
-- but read the tenant's keys or the table; roll the reconciler soon after.
--
-- Building the new indexes reads the whole table under a lock that holds
-- writes back (seconds per million rows): a large install builds them first
-- with CREATE INDEX CONCURRENTLY and the same definitions (docs/deploy.md,
-- Upgrades), which IF NOT EXISTS then keeps.

-- "key IS NOT NULL" is always true (the column is NOT NULL) and keeps the
-- planner from taking this index for a query that does not name the key: a
-- LIKE on the key implies it, the claim's probes of a tenant's pending rows
-- do not. Without it, on a table without statistics yet (just after a bulk
-- intake), those probes read this index, every pending row of the tenant,
-- and sort them, instead of the first entry of reminders_pending_tenant.
CREATE INDEX IF NOT EXISTS reminders_waiting_keys ON reminders (tenant, key text_pattern_ops)
    WHERE state IN ('pending', 'leased', 'retrying', 'quarantined') AND key IS NOT NULL;
DROP INDEX IF EXISTS reminders_open_keys;

CREATE INDEX IF NOT EXISTS reminders_parked ON reminders (channel, state)
    WHERE state IN ('leased', 'retrying', 'quarantined');
DROP INDEX IF EXISTS reminders_in_flight;

-- As version 14's, with the rows it selects found over three indexes: the
-- waiting rows by key prefix (reminders_waiting_keys), the enqueued and
-- sending ones among the work in flight (reminders_enqueued,
-- reminders_leases). Each part yields at most p_limit ids, oldest first, so
-- their union holds the p_limit oldest open rows. The in-flight parts test
-- tenant and key as "(...) IS TRUE", which no index can serve: the planner
-- then reads the small in-flight index rather than, on a table without
-- statistics, AND it with every key of the tenant (reminders_logical_key).
CREATE OR REPLACE FUNCTION nudge_cancel_prefix(p_tenant text, p_key_prefix text, p_limit integer DEFAULT 1000,
                                               p_actor text DEFAULT 'intake',
                                               p_reason text DEFAULT 'canceled by application')
RETURNS SETOF nudge_change LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    IF p_key_prefix IS NULL OR p_key_prefix = '' THEN
        RAISE EXCEPTION 'nudge: field "key_prefix" is required (an empty prefix would match every key)'
            USING ERRCODE = '22023', COLUMN = 'key_prefix';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 10000 THEN
        RAISE EXCEPTION 'nudge: field "limit" must be from 1 to 10000, got %', coalesce(p_limit::text, 'NULL')
            USING ERRCODE = '22023', COLUMN = 'limit';
    END IF;
    RETURN QUERY
    WITH candidates AS (
        (SELECT r.id FROM reminders r
          WHERE r.tenant = p_tenant AND r.key LIKE nudge_key_prefix_pattern(p_key_prefix)
            AND r.state IN ('pending', 'leased', 'retrying', 'quarantined')
          ORDER BY r.id
          LIMIT p_limit)
        UNION ALL
        (SELECT r.id FROM reminders r
          WHERE r.state = 'enqueued'
            AND (r.tenant = p_tenant AND r.key LIKE nudge_key_prefix_pattern(p_key_prefix)) IS TRUE
          ORDER BY r.id
          LIMIT p_limit)
        UNION ALL
        (SELECT r.id FROM reminders r
          WHERE r.state = 'sending' AND r.lease_until IS NOT NULL
            AND (r.tenant = p_tenant AND r.key LIKE nudge_key_prefix_pattern(p_key_prefix)) IS TRUE
          ORDER BY r.id
          LIMIT p_limit)
    ), picked AS MATERIALIZED (
        SELECT r.id, r.key, r.state
          FROM reminders r
         WHERE r.id IN (SELECT c.id FROM candidates c)
           AND r.tenant = p_tenant
           AND r.state IN ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined')
         ORDER BY r.id
         LIMIT p_limit
           FOR UPDATE
    ), canceled AS (
        UPDATE reminders r
           SET state = 'canceled', fence = r.fence + 1, lease_until = NULL, reason = p_reason,
               updated_at = now(), finished_at = now()
          FROM picked p
         WHERE r.id = p.id AND p.state <> 'sending'
        RETURNING r.id, p.state AS from_state, r.fence
    ), events AS (
        INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
        SELECT c.id, c.from_state, 'canceled', c.fence, p_actor, 'canceled', p_reason, now()
          FROM canceled c
    )
    SELECT p.id, p.key,
           CASE WHEN p.state = 'sending' THEN 'sending' ELSE 'changed' END,
           CASE WHEN p.state = 'sending' THEN 'sending' ELSE 'canceled' END
      FROM picked p
     ORDER BY p.id;
END $$;

-- CREATE OR REPLACE keeps the grants of version 14 but not its settings:
-- pinned to this schema again, as every SECURITY DEFINER function.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION nudge_cancel_prefix(text, text, integer, text, text) SET search_path = %I, pg_temp',
                   current_schema());
END $$;
