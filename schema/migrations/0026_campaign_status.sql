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
