-- Nudge schema, version 31: a delivery attempt costs fewer writes (issue 18).
--
-- Every attempt row is inserted by ClaimForDelivery and updated once with
-- its outcome by RecordOutcomes. Three costs of that pair are not the row's
-- own (measured per delivered reminder with BenchmarkStatementCosts,
-- docs/benchmarks.md):
--
-- 1. The foreign key to reminders. Its check runs a query per inserted
--    attempt (an index probe of reminders_pkey and a row lock FOR KEY SHARE
--    on the reminder the same statement has just rewritten): one heap LOCK
--    record (~58 bytes of WAL) per attempt and a third of the insert's time.
--    The attempt is only ever inserted by the statement that updates its
--    reminder to sending, so the reminder exists; what the key still did
--    was ON DELETE CASCADE, for retention's DeleteReminders (of this
--    release and the ones before it). A statement trigger on reminders now
--    deletes the attempts of the rows a statement deleted, once per
--    statement, as the table's owner (as the cascade did, whatever the
--    deleting role may read).
--
-- 2. The outcome's update was HOT only about half the time: the insert
--    fills the page, and the updated tuple (with its finished time, result
--    and the provider's message id) then has to go to another page, with a
--    new entry in both of the table's indexes and a LOCK record on the old
--    tuple. With a fillfactor of 50 the insert leaves room on the page for
--    the update: 0.48 -> 0.87 of the updates HOT in the benchmark, for ~25%
--    more heap pages (attempts are deleted after the payload window, 7 days
--    by default). The setting applies to pages filled from now on; existing
--    pages are not rewritten.
--
-- 3. The worker's claim (enqueued -> sending) rewrote the reminder into
--    reminders_open_deadline, whose predicate held sending rows too: one
--    index entry per attempt that no statement needs. The rows that index
--    serves are those owed an expiry: open ones past their deadline, and
--    sending ones only once their send lease has run out, which
--    reminders_leases finds (a sending row always holds a send lease). It is
--    replaced by reminders_unsent_deadline, without sending rows.
--    ExpireOverdue and UnknownAtDeadline now read the two indexes as two
--    ordered parts.
--
-- Rolling upgrade: workers of any version insert and update attempts as
-- before; retention of any version deletes reminders as before and their
-- attempts still go with them. The previous release's ExpireOverdue and
-- UnknownAtDeadline (a reconciler not yet rolled) test "state IN (the
-- unsent states) OR (sending AND lease_until <= now)": the planner serves
-- it with a BitmapOr of the two indexes (rows owed an expiry, sorted), as
-- it serves the scrape's and nudgectl stats' min(deadline) over the unsent
-- states with the new index. Dropping the key and adding the trigger take
-- brief exclusive locks on both tables, no scan. Building the new index
-- reads the whole table under a lock that holds writes back (seconds per
-- million rows): a large install builds it first with CREATE INDEX
-- CONCURRENTLY and the same definition (docs/deploy.md, Upgrades), which IF
-- NOT EXISTS then keeps.

ALTER TABLE delivery_attempts DROP CONSTRAINT IF EXISTS delivery_attempts_reminder_id_fkey;

CREATE OR REPLACE FUNCTION nudge_delete_attempts_of_deleted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    DELETE FROM delivery_attempts a USING deleted d WHERE a.reminder_id = d.id;
    RETURN NULL;
END $$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION nudge_delete_attempts_of_deleted() SET search_path = %I, pg_temp',
                   current_schema());
END $$;
REVOKE ALL ON FUNCTION nudge_delete_attempts_of_deleted() FROM PUBLIC;

CREATE TRIGGER reminders_delete_attempts AFTER DELETE ON reminders
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION nudge_delete_attempts_of_deleted();

ALTER TABLE delivery_attempts SET (fillfactor = 50);

CREATE INDEX IF NOT EXISTS reminders_unsent_deadline ON reminders (deadline)
    WHERE state IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined');
DROP INDEX IF EXISTS reminders_open_deadline;
