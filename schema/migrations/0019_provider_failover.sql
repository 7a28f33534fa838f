-- Nudge schema, version 19: SMS provider failover shared by the fleet (issue 16).
--
-- A channel may list several providers in order (sms-worker --sms-providers
-- twilio,generic). Which one the fleet sends through is one row per channel
-- here, never a per-process choice, so that four replicas move together:
--
--   current          the provider in use;
--   failures         consecutive retryable failures at current;
--   window_start,    sends and retryable failures at current since
--   window_sends,    window_start (the error-rate window; a report after the
--   window_failures  window restarts it);
--   chosen_at        when current was chosen;
--   probe_at         while current is not the first provider, when one worker
--                    may next try the first (NULL on the first).
--
-- Every change is one conditional UPDATE (internal/store/queries.sql,
-- Failover*): a report counts only against the provider still current, and a
-- switch happens only from the provider the switching worker saw, so two
-- workers that trip at once switch once.
CREATE TABLE provider_failover (
    channel         text        PRIMARY KEY,
    current         text        NOT NULL,
    failures        integer     NOT NULL DEFAULT 0,
    window_start    timestamptz NOT NULL,
    window_sends    integer     NOT NULL DEFAULT 0,
    window_failures integer     NOT NULL DEFAULT 0,
    chosen_at       timestamptz NOT NULL,
    probe_at        timestamptz
);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'nudge_worker') THEN
        GRANT SELECT, INSERT, UPDATE ON provider_failover TO nudge_worker;
    END IF;
END $$;
