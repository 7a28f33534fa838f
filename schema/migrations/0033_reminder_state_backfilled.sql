-- Recorded once every reminder has its reminder_state row. schema.Migrate
-- copies the rows that predate migration 0032 before it applies this one
-- (schema/backfill.sql: batches of 10,000 by id, each its own transaction);
-- this check makes a database whose copy is incomplete fail here, with
-- nothing recorded, instead of running binaries that would not see those
-- reminders. Run nudgectl migrate again: the copy resumes where it stopped.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM reminders r
                WHERE NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)) THEN
        RAISE EXCEPTION 'reminder_state lacks rows of reminders: the backfill did not finish; run nudgectl migrate again';
    END IF;
END $$;
