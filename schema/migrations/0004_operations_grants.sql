-- Nudge schema, version 4: privileges for what version 3 added (the
-- dispatcher's heartbeat, operator decisions, the database-derived gauges,
-- retention), in the style of version 2: column by column, per component.
--
--   nudge_dispatcher  records its run in dispatch_runs
--   nudge_reconciler  reads what the gauges need (due and finish times,
--                     dispatch_runs); still no recipients, templates or data
--   nudge_operator    replay and expire: state transitions only (never a
--                     reminder's tenant, key, recipient or content, never a
--                     delete), each one recorded as an event and in
--                     operator_audit
--   nudge_retention   (new) the cleanup pass the reconciler runs: purges
--                     payloads and deletes old terminal rows, attempts, events,
--                     audit rows and runs; a reconciler login is a member of
--                     both nudge_reconciler and nudge_retention

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'nudge_retention') THEN
        BEGIN
            CREATE ROLE nudge_retention NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL; -- created by a concurrent migration in another database
        END;
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO nudge_retention', current_schema());
END $$;

-- Row-level security on reminders and reminder_events (version 2) hides rows
-- from roles without a policy.
CREATE POLICY nudge_retention ON reminders TO nudge_retention USING (true) WITH CHECK (true);
CREATE POLICY nudge_retention ON reminder_events TO nudge_retention USING (true) WITH CHECK (true);

GRANT INSERT (actor, cutoff, finished_at, claimed, enqueued, expired, released, out_of_budget, error)
    ON dispatch_runs TO nudge_dispatcher;

GRANT SELECT (due_at, finished_at, updated_at, created_at, purged_at) ON reminders TO nudge_reconciler;
GRANT SELECT ON dispatch_runs TO nudge_reconciler;

GRANT UPDATE (state, fence, attempts, republishes, lease_until, next_attempt_at, enqueued_at,
              finished_at, reason, last_error, updated_at)
    ON reminders TO nudge_operator;
GRANT SELECT ON dispatch_runs, operator_audit TO nudge_operator;
GRANT INSERT (at, actor, action, channel, reminder_id, message_id, reason, detail)
    ON operator_audit TO nudge_operator;

GRANT SELECT ON reminders, delivery_attempts, reminder_events, operator_audit, dispatch_runs
    TO nudge_retention;
GRANT UPDATE (data, recipient, last_error, purged_at, updated_at) ON reminders TO nudge_retention;
GRANT DELETE ON reminders, delivery_attempts, reminder_events, operator_audit, dispatch_runs
    TO nudge_retention;

-- nudge_outcome_unknown (version 1) reads attempts' outcomes when the worker
-- or the reconciler ends a reminder undelivered.
GRANT SELECT (id, reminder_id, outcome, error) ON delivery_attempts TO nudge_worker, nudge_reconciler;
GRANT SELECT (reason) ON reminders TO nudge_worker;
