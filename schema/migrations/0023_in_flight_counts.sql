-- Schema version 23: a metrics scrape that does not grow with the table
-- (issue 18).
--
-- The reconciler's DB collector counted every open reminder per scrape, and
-- open includes every reminder scheduled for later: with a SaaS scheduling
-- months ahead that is tens of millions of rows counted every 15 seconds.
-- It now counts pending reminders only once they are due (the dispatcher's
-- backlog, over reminders_pending_due) and the in-flight states over this
-- index, which holds only rows that a worker, the broker or an operator
-- holds: it is as small as the work in flight, however many reminders wait
-- for tomorrow or lie terminal. Its columns are what the count groups by,
-- so the count is an index-only scan.
--
-- Building it reads the whole table under a lock that holds writes back
-- (seconds per million rows): a large install can build it beforehand with
-- CREATE INDEX CONCURRENTLY and the same definition (docs/deploy.md,
-- Upgrades), which IF NOT EXISTS then keeps.
CREATE INDEX IF NOT EXISTS reminders_in_flight ON reminders (channel, state)
    WHERE state IN ('leased', 'enqueued', 'sending', 'retrying', 'quarantined');
