-- Schema version 44, after the rollout of the release that runs the
-- promoter (schemas 38-41): lazy intake on, and reminder_state's foreign key
-- dropped (issue 18, the due-ordered store's slice 4; docs/benchmarks.md, "A
-- due-ordered store for the spread claim, measured before building it").
--
-- Why it waits for the rollout. From here a reminder due at least the
-- horizon after intake's clock gets no reminder_state row until the
-- promoter (internal/store Promote, run by every dispatcher of this release)
-- inserts it, up to --promote-ahead (H) before it is due. A binary of the
-- release before 38 JOINs reminder_state without a fallback and does not
-- materialize: it would not see such a reminder (its intake's duplicate
-- check, Get, cancel and reschedule would answer "not found"), and its
-- dispatcher does not promote, so a fleet of it would never deliver one.
-- And its retention deletes a reminder's state row through the foreign key's
-- cascade, which goes below. So both wait for nudgectl migrate
-- --after-rollout, once no such binary runs (the release of 41 and later:
-- every statement LEFT JOINs, every write materializes first, retention
-- deletes the state rows itself).
--
-- The horizon is 2H with H the dispatcher's default --promote-ahead (1 h):
-- a reminder due within 2 h of intake gets its state row at intake (the
-- 09:00 burst, scheduled the evening before, is past it and promoted in due
-- order; one due in 30 minutes is not). A pass promotes at most
-- least(H, horizon) ahead of the database's clock, so a dispatcher run with
-- a larger --promote-ahead promotes up to 2 h ahead. A pass before this
-- step reached H ahead (no horizon yet): a dispatcher run with a larger H
-- may have moved the watermarks past now + 2 h, and a reminder made lazy
-- below the final watermark would never be promoted (the promoter sweeps
-- from it). So the step moves them back to now, never forward, and drops a
-- sweep in progress: that only costs the next passes a re-scan of what was
-- promoted. Lowering the horizon later needs the same care (docs/deploy.md,
-- "Schema 44"). To turn
-- lazy intake off again: UPDATE nudge_lazy_intake SET horizon = NULL; the
-- reminders already lazy keep being promoted by every dispatcher pass.
--
-- The foreign key (reminder_state.id REFERENCES reminders ON DELETE
-- CASCADE) is the promotion's main cost: its check locks the referenced
-- wide row (FOR KEY SHARE) on a random page of reminders for every state row
-- the promoter inserts (docs/benchmarks.md: 60-87 us of CPU and a WAL record
-- a row at 1M, against 13-19 us without it). No state row can lose its
-- reminder without it: a state row is inserted only from its reminder's row
-- (intake, the promoter, nudge_materialize), and reminders are deleted only
-- by retention (nudge_retention: no other role may delete them, and only
-- terminal ones), which deletes their state rows in the same statement
-- (internal/retention DeleteReminders).
--
-- Locks: dropping the key takes ACCESS EXCLUSIVE on both tables (its
-- triggers live on both), for a catalogue change only: no scan, no rewrite.
-- They are taken first, by one LOCK in the order intake takes its own locks
-- (reminders, then reminder_state), so nothing is upgraded later in this
-- file; a fleet transaction that takes them the other way round meets
-- schema.Migrate's retry on deadlock. The setting's row is updated last
-- (intake reads it in its snapshot and never locks it).
-- The promoter's row is locked before them, as a pass locks it before it
-- reads reminders: a pass in progress finishes first, the next one waits.
SELECT 1 FROM nudge_promoter FOR UPDATE;
LOCK TABLE reminders, reminder_state IN ACCESS EXCLUSIVE MODE;
ALTER TABLE reminder_state DROP CONSTRAINT IF EXISTS reminder_state_id_fkey;
UPDATE nudge_lazy_intake SET horizon = interval '2 hours' WHERE horizon IS NULL;
UPDATE nudge_promoter
   -- (least() would turn a NULL prov_until, no sweep completed yet, into
   -- now(): a provisional end that no sweep scanned, which the next pass
   -- would then make final.)
   SET final_until = least(final_until, now()),
       prov_until = CASE WHEN prov_until > now() THEN now() ELSE prov_until END,
       sweep_until = NULL, sweep_wait = NULL, sweep_prev_done = NULL, cursor_due = NULL, cursor_id = NULL;

-- The scrape's estimate of the reminders scheduled for later
-- (internal/metrics, nudge_pending_reminders_estimate) counted the pending
-- state rows (reltuples of reminder_state_pending_due); from here the lazy
-- reminders not yet promoted have none. They are the lazy reminders due at or
-- after the promoter's final watermark (a few between it and the provisional
-- end are promoted already: at most H of them, counted twice). A scrape must
-- not read them (issue 18: the scrape at 10M within 2x of 10k), so the
-- figure is the planner's row estimate, from statistics on the due time of
-- lazy reminders alone: an expression that is NULL for the others. The
-- column statistics of due_at and lazy would not do: the planner multiplies
-- their selectivities as if independent, where every lazy reminder is due
-- in the future (2.3x short in a trial of 45k lazy among 105k). ANALYZE
-- (autovacuum's, as for every other estimate) fills them; before the first,
-- the function falls back on reminders_due_order's reltuples (every lazy
-- reminder, promoted or not; 0 until then, as nothing was lazy before this
-- step).
CREATE STATISTICS IF NOT EXISTS reminders_lazy_due ON (CASE WHEN lazy THEN due_at END) FROM reminders;
COMMENT ON STATISTICS reminders_lazy_due IS
    'The due times of lazy reminders (NULL for the others), for nudge_unpromoted_estimate: the planner estimates '
    'the lazy reminders due after the promoter''s final watermark from them without reading the table.';

-- SECURITY DEFINER: the statistics of an expression are visible to the
-- table's owner only (pg_stats_ext_exprs). EXPLAIN plans, it does not run
-- (no row is read: the relation's size, the indexes' metapages), and the
-- estimate is clamped to 1 row at least. VOLATILE because EXPLAIN is a
-- utility statement, which a STABLE function may not run.
CREATE OR REPLACE FUNCTION nudge_unpromoted_estimate() RETURNS double precision
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    not_lazy real;
    plan     json;
BEGIN
    SELECT x.null_frac INTO not_lazy
      FROM pg_stats_ext_exprs x
     WHERE x.statistics_schemaname = current_schema() AND x.statistics_name = 'reminders_lazy_due';
    IF not_lazy IS NULL THEN
        RETURN (SELECT greatest(c.reltuples, 0) FROM pg_class c WHERE c.oid = 'reminders_due_order'::regclass);
    ELSIF not_lazy >= 1 THEN
        RETURN 0; -- none lazy when analyzed (the planner would say 1, its least estimate)
    END IF;
    EXECUTE format('EXPLAIN (FORMAT JSON) SELECT FROM reminders r WHERE (CASE WHEN r.lazy THEN r.due_at END) >= %L',
                   (SELECT p.final_until FROM nudge_promoter p)) INTO plan;
    RETURN (plan -> 0 -> 'Plan' ->> 'Plan Rows')::double precision;
END $$;
DO $$ BEGIN
    EXECUTE format('ALTER FUNCTION nudge_unpromoted_estimate() SET search_path = %I, pg_temp', current_schema());
END $$;
REVOKE ALL ON FUNCTION nudge_unpromoted_estimate() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION nudge_unpromoted_estimate() TO nudge_reconciler, nudge_operator;
