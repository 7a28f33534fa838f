-- Schema version 26: what campaign status and the planner's metrics read,
-- bounded (issue 15, operators).
--
-- `nudgectl campaign status` and the console count a campaign's reminders by
-- state ("deliveries by outcome"). A campaign's reminders are those of its
-- tenant whose key starts with campaign:<id>: (the planner's stable keys).
-- This index holds campaign reminders only, bytewise (text_pattern_ops, so a
-- prefix range uses it under any collation), with their state, so the count
-- reads the campaign's own rows, index-only once vacuumed: never the other
-- tenants' reminders, nor the tenant's single ones. A statement must repeat
-- the predicate (key LIKE 'campaign:%') for the planner to use it.
--
-- Building it reads the whole table under a lock that holds writes back
-- (seconds per million rows): a large install can build it beforehand with
-- CREATE INDEX CONCURRENTLY and the same definition (docs/deploy.md,
-- Upgrades), which IF NOT EXISTS then keeps.
CREATE INDEX IF NOT EXISTS reminders_campaign_keys ON reminders (tenant, key text_pattern_ops) INCLUDE (state)
    WHERE key LIKE 'campaign:%';

-- The runnable campaigns: the planner's gauges (the oldest runnable planning
-- command, checkpoint lag) read these at scrape time, however many campaigns
-- have ended.
CREATE INDEX campaigns_runnable ON campaigns (updated_at) WHERE state = 'planning';

-- A campaign's status for the web tier (as `nudgectl campaign status`, less
-- what needs the audience source): its state and counts, the slices done and
-- when the last one committed, what a late campaign left unplanned and in how
-- many slices, and its reminders by state (over reminders_campaign_keys: its
-- own rows only). Tenant-checked like the other campaign functions; another
-- tenant's campaign, or none, raises no_data_found.
CREATE FUNCTION nudge_campaign_status(p_tenant text, p_id bigint)
RETURNS TABLE (state text, planned bigint, bad bigint, slices bigint, last_checkpoint timestamptz,
               unplanned bigint, late_slices bigint, deadline timestamptz, deliveries jsonb)
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    RETURN QUERY
    SELECT c.state, c.planned, c.bad, c.fence,
           (SELECT s.at FROM campaign_slices s WHERE s.campaign_id = c.id ORDER BY s.slice DESC LIMIT 1),
           c.unplanned,
           -- In the campaign's slice size (NULL from schema 25 on: the
           -- planner's; then its largest slice so far, or 200).
           (SELECT CASE WHEN c.state = 'late' THEN (coalesce(c.unplanned, 0) + z.size - 1) / z.size ELSE 0 END
              FROM (SELECT coalesce(c.slice_size, (SELECT max(s.rows_read) FROM campaign_slices s
                                                    WHERE s.campaign_id = c.id), 200) AS size) z)::bigint,
           c.deadline,
           (SELECT coalesce(jsonb_object_agg(d.state, d.n), '{}'::jsonb)
              FROM (SELECT r.state, count(*) AS n FROM reminders r
                     WHERE r.tenant = c.tenant AND r.key LIKE 'campaign:%'
                       AND r.key ~>=~ ('campaign:' || c.id || ':') AND r.key ~<~ ('campaign:' || c.id || ';')
                     GROUP BY r.state) d)
      FROM campaigns c
     WHERE c.id = p_id AND c.tenant = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'nudge: tenant % has no campaign %', quote_literal(p_tenant), p_id USING ERRCODE = 'P0002';
    END IF;
END $$;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION nudge_campaign_status(text, bigint) SET search_path = %I, pg_temp', current_schema());
END $$;
REVOKE ALL ON FUNCTION nudge_campaign_status(text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION nudge_campaign_status(text, bigint) TO nudge_intake, nudge_operator;
