-- The dispatcher's own statements beside internal/store's transitions: the
-- run report. Time comes from the caller.

-- name: RecordRun
-- One row per dispatcher run, failed ones included: the heartbeat behind "is
-- the dispatcher advancing its cutoff" (nudgectl stats and the reconciler's
-- nudge_dispatch_cutoff_lag_seconds read it).
INSERT INTO dispatch_runs (actor, cutoff, finished_at, claimed, enqueued, expired, released, out_of_budget, error)
VALUES (@actor, @cutoff, @finished_at, @claimed, @enqueued, @expired, @released, @out_of_budget,
        nullif(@error::text, ''));
