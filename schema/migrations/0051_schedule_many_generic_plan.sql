-- Schema version 51: nudge_schedule_many plans its statement once per
-- session, whatever the batch size (issue 18).
--
-- The set-based statement in nudge_schedule_many_unchecked takes its rows
-- from arrays. PostgreSQL's plan cache (plan_cache_mode = auto) compares the
-- generic plan, which takes every array for 10 elements, with custom plans
-- made for the actual arrays: for fewer than 10 reminders a call the custom
-- plan looks cheaper, so the whole statement was planned again at every
-- call. Measured, 3 reminders a call: 1.11 and 1.43 CPU-s of the backend per
-- 1,000 reminders, against 0.27 and 0.39 with the generic plan; 1,000 a call:
-- 0.055-0.080 either way (docs/benchmarks.md, "nudge_schedule_many at a few
-- reminders a call"). The README's example schedules two.
--
-- The setting applies inside the function only (PostgreSQL restores the
-- caller's on return); the body, its grants and its contract are unchanged.
ALTER FUNCTION nudge_schedule_many_unchecked(text[], text[], text[], text[], text[], text[], timestamptz[],
                                             timestamptz[], text, text[], timestamp[], timestamp[], time[],
                                             time[], integer[])
    SET plan_cache_mode = force_generic_plan;
