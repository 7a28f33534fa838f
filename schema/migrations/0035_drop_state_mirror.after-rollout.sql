-- Schema version 35, after the rollout: drop the state mirror of migration 32
-- (issue 18, layout A).
--
-- RUN ONLY WHEN NO BINARY OF THE PREVIOUS RELEASE RUNS (`nudgectl migrate
-- --after-rollout`, docs/deploy.md). The previous release reads and writes
-- the state columns of reminders; from here on nothing copies
-- reminder_state into them, so such a binary would claim, deliver or cancel
-- by a stale state. A plain `nudgectl migrate` (the migration Job, every
-- binary's release) stops before this file and reports it as waiting.
--
-- This release reads and writes state on reminder_state only (the store,
-- dispatch, ops, retention, metrics, campaign and intake statements, and
-- the SQL functions and the timeline view since version 34), and inserts
-- each new reminder's state row itself (intake's ScheduleMany and
-- nudge_try_schedule_unchecked). With the mirror gone a transition rewrites
-- the ~110-byte state row only: no wide row, none of its index entries
-- (docs/benchmarks.md measured the mirror at ~1.7x the WAL and ~2x the CPU
-- per delivered reminder of the state-row-only layout).
--
-- What goes:
-- - the three mirror triggers and their functions;
-- - the indexes of reminders that served only its state: the 11 whose
--   predicate names state (each replaced by reminder_state's of the same
--   name since version 32), and reminders_waiting_keys (its predicate) and
--   reminders_campaign_keys (state in INCLUDE), whose prefix lookups use
--   reminders_keys since version 34 (nudge_cancel_prefix, CountPrefix,
--   nudge_campaign_status). They would otherwise keep indexing a state that
--   nothing updates any more, and every insert would still pay for them.
-- What stays: the state columns of reminders, now stale (a new reminder's
-- keep their defaults and intake's values), with their CHECKs; the next
-- release drops them together with the tests that still read them.
--
-- Each DROP takes a short ACCESS EXCLUSIVE lock on reminders: it waits for
-- the running transactions on reminders, and holds the fleet's next ones
-- for as long as the catalog change takes (milliseconds).

DROP TRIGGER IF EXISTS reminders_state_mirror_inserted ON reminders;
DROP TRIGGER IF EXISTS reminders_state_mirror_updated ON reminders;
DROP TRIGGER IF EXISTS reminder_state_mirror_back ON reminder_state;
DROP FUNCTION IF EXISTS nudge_state_mirror_inserted(), nudge_state_mirror_updated(), nudge_state_mirror_back();

DROP INDEX IF EXISTS reminders_pending_due, reminders_pending_tenant, reminders_leases, reminders_enqueued,
                     reminders_unsent_deadline, reminders_terminal, reminders_terminal_unpurged,
                     reminders_retrying, reminders_parked, reminders_replayable, reminders_expired,
                     reminders_waiting_keys, reminders_campaign_keys;

-- The zone and window checks of reminders (reminders_tz_name,
-- reminders_window) vetted every zone and window written through the
-- mirror; from here on they are written to reminder_state alone
-- (nudge_reschedule_window), so the same checks move there, NOT VALID as
-- on reminders (rows older than the checks are not rescanned; every new or
-- changed row is checked).
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT conname, pg_get_constraintdef(oid) AS def
               FROM pg_constraint
              WHERE conrelid = 'reminders'::regclass AND conname IN ('reminders_tz_name', 'reminders_window')
    LOOP
        EXECUTE format('ALTER TABLE reminder_state ADD CONSTRAINT %I %s',
                       replace(c.conname, 'reminders_', 'reminder_state_'),
                       CASE WHEN c.def LIKE '% NOT VALID' THEN c.def ELSE c.def || ' NOT VALID' END);
    END LOOP;
END $$;
