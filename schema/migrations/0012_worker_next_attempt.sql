-- Nudge schema, version 12: the worker reads a retrying row's next attempt time (issue 13, finding 8).
--
-- The worker reads next_attempt_at: ClaimForDelivery never claims a retrying
-- row before it (a replayed or early retry message waits for its back-off),
-- and the worker defers such a message until then.
GRANT SELECT (next_attempt_at) ON reminders TO nudge_worker;
