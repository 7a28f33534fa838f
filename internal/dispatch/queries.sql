-- The dispatcher's own statements beside internal/store's transitions: the
-- run report. Time comes from the caller.

-- name: RecordRun
-- One row per dispatcher run, failed ones included (an --every loop's row
-- covers its passes since the previous row: at most one a second while they
-- claim, one a minute while idle): the heartbeat behind "is the dispatcher
-- advancing its cutoff" (nudgectl stats and the reconciler's
-- nudge_dispatch_cutoff_lag_seconds read it).
-- hops holds the run's hop latencies (metrics.HopCounts, schema version 15),
-- which the reconciler exports.
-- promoted, final_until and prov_until are the run's promoter passes'
-- (schema 38).
INSERT INTO dispatch_runs (actor, cutoff, finished_at, claimed, enqueued, expired, released, out_of_budget, error, hops,
                           promoted, final_until, prov_until)
VALUES (@actor, @cutoff, @finished_at, @claimed, @enqueued, @expired, @released, @out_of_budget,
        nullif(@error::text, ''), coalesce(@hops::jsonb, '{}'::jsonb), @promoted, @final_until, @prov_until);

-- name: ExpireDue
-- The expire-only part of ClaimDue, for a run that cannot publish (the
-- broker is unreachable): pending rows due before the run's cutoff whose
-- deadline has passed end as expired, as ClaimDue would end them, and
-- nothing is claimed for publishing. One row per channel: how many.
-- The rows are found by deadline in reminder_state_expiry, its predicate
-- stated as that index states it ("state COLLATE "C"", schema 42): no
-- other index can then be read for them, whatever the statistics say.
WITH late AS (
    SELECT id
      FROM reminder_state
     WHERE state COLLATE "C" = 'pending' AND deadline <= @now AND due_at <= @cutoff
     ORDER BY deadline
     LIMIT @limit
       FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE reminder_state s
       SET state = 'expired', fence = s.fence + 1, lease_until = NULL,
           reason = 'deadline passed before dispatch', finished_at = @now, updated_at = @now
      FROM late
     WHERE s.id = late.id AND (s.state = 'pending') IS TRUE
 RETURNING s.id, s.fence, s.channel
), events AS (
    INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    SELECT id, 'pending', 'expired', fence, @actor, 'deadline_before_dispatch', 'deadline passed before dispatch', @now
      FROM upd
)
SELECT channel, count(*) FROM upd GROUP BY channel;

-- name: NextDue
-- When the --every loop's next pass has work: the earliest pending row due
-- after @after (the last pass's cutoff), the first entry of
-- reminder_state_pending_due past it. NULL: none is pending.
SELECT (SELECT due_at FROM reminder_state
         WHERE state = 'pending' AND due_at > @after
         ORDER BY due_at, id
         LIMIT 1);
