-- internal/ops Replay's candidates (its first CTE) with its parameters bound: tenant-5, no
-- window, a batch of 1,000. bench.sh sets TABLE (reminders on 31, reminder_state after) and
-- STATES (failed,quarantined, or every replayable state).
SELECT x.id, x.state, x.fence FROM TABLE x
 WHERE x.id > 0
   AND (coalesce(cardinality(NULL::bigint[]), 0) = 0 OR x.id = ANY(NULL::bigint[]))
   AND (true)
   AND ('' = '' OR x.channel = '')
   AND ('tenant-5' = '' OR x.tenant = 'tenant-5')
   AND x.state = ANY('{STATES}'::text[])
   AND (x.state IN ('failed', 'quarantined')
     OR (x.state = 'enqueued' AND x.enqueued_at <= '2026-12-02')
     OR (x.state = 'retrying' AND x.next_attempt_at <= '2026-12-02')
     OR (x.state = 'leased' AND x.lease_until <= '2026-12-02'))
 ORDER BY x.id LIMIT 1000
