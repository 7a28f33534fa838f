-- Schema version 49, after the rollout of the release whose workers accept
-- envelopes (message.Batch) of up to 200 reminders (message.MaxBatchEntries;
-- issue 18): the dispatcher's limit on an envelope's entries.
--
-- The previous release's workers refuse an envelope of more than 100 entries
-- as malformed and dead-letter it whole. This release's dispatcher reads this
-- row (store.EnvelopeLimit, at its start and then at most once a minute) and
-- caps --envelope-size and --burst-envelope-size at it; while the table does
-- not exist it caps them at 100 (message.PreviousMaxBatchEntries). So the
-- table appears only once no worker of the previous release runs (nudgectl
-- migrate --after-rollout). To go back to the previous release's workers,
-- first lower the limit and wait a minute (docs/deploy.md, "Schema 49"):
--   UPDATE nudge_envelope_limit SET max_entries = 100;
CREATE TABLE IF NOT EXISTS nudge_envelope_limit (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_entries int     NOT NULL CHECK (max_entries >= 1)
);
INSERT INTO nudge_envelope_limit (singleton, max_entries) VALUES (true, 200) ON CONFLICT DO NOTHING;
COMMENT ON TABLE nudge_envelope_limit IS
    'The most reminders a dispatcher puts in one envelope (message.Batch): 200 once every worker accepts '
    'that many (after-rollout step 49); the dispatcher caps its envelope sizes at it and reads it at most '
    'once a minute. Lower it (to 100) before rolling workers back to a release before 49''s.';
GRANT SELECT ON nudge_envelope_limit TO nudge_dispatcher, nudge_reconciler, nudge_operator;
