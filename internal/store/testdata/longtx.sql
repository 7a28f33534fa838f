-- The promoter under a long web transaction (BenchmarkPromoterUnderLongTransaction,
-- longtx_bench_test.go). Test-only SQL: the fixture of a table in the lazy
-- layout after schema 44, built by bulk statements instead of intake.

-- name: LongTxFill
-- Rows @first..@last of lazy reminders keyed @prefix || i, due uniformly
-- over [@from, @to) in random order (channels alternating, 16 tenants),
-- without state rows: as lazy intake (schema 44) leaves a reminder
-- scheduled more than the horizon ahead.
INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key,
                       created_at, lazy)
SELECT 'tenant-' || (i % 16), @prefix || i, t.channel,
       CASE WHEN t.channel = 'sms' THEN '+1415' || lpad((i % 10000000)::text, 7, '0') ELSE 'u' || i || '@example.com' END,
       'course-expiry', '{"course": "Go 101"}'::jsonb, t.due_at, t.due_at + interval '1 day',
       'nudge-' || md5(@prefix || i), @from::timestamptz - interval '3 days', true
  FROM generate_series(@first::bigint, @last::bigint) AS i,
       LATERAL (SELECT CASE WHEN i % 2 = 0 THEN 'sms' ELSE 'email' END AS channel,
                       @from::timestamptz + random() * (@to::timestamptz - @from::timestamptz) AS due_at) t;

-- name: LongTxDelivered
-- The state rows of the reminders due before @now, delivered: what the
-- promoter, the claim and the workers left of them. A long transaction's
-- re-scan reads them again (the due-order index keeps lazy reminders until
-- retention), each a primary-key probe of reminder_state.
INSERT INTO reminder_state (id, tenant, channel, state, fence, due_at, deadline, tz, window_open, window_close,
                            window_days, updated_at, finished_at, claimed_at, claimed_fence, claimed_by,
                            started_at, started_fence, started_by, delivered_by, attempts, enqueued_at,
                            dispatch_batch)
SELECT r.id, r.tenant, r.channel, 'delivered', 2, r.due_at, r.deadline, r.tz, r.window_open, r.window_close,
       r.window_days, r.due_at, r.due_at, r.due_at, 1, 'dispatcher', r.due_at, 2, 'worker', 'worker', 1, r.due_at, 1
  FROM reminders r
 WHERE r.lazy AND r.due_at < @now::timestamptz
 ORDER BY r.due_at, r.id;

-- name: LongTxWatermark
-- The promoter's row as a running dispatcher leaves it with everything
-- below @final promoted: no sweep in progress, nobody to wait for.
UPDATE nudge_promoter
   SET final_until = @final, prov_until = @final, prov_wait = '{}', sweep_until = NULL, sweep_wait = NULL,
       sweep_prev_done = NULL, cursor_due = NULL, cursor_id = NULL;

-- name: LongTxAge
-- A long transaction's age, emulated: the final watermark moved back by
-- @age from @final, where it stood when the transaction began, as @age of
-- passes with it open would have left it (final stays at the end of the
-- last sweep whose writers were gone), and so are the floors of the
-- writers waited for (schema 46: a writer's floor is the provisional end
-- read before it was first seen, about where final stood when it began).
-- It costs re-scans only (as schema 44's step).
UPDATE nudge_promoter
   SET final_until = @final::timestamptz - @age::interval,
       floor_at = coalesce((SELECT array_agg(least(f, @final::timestamptz - @age::interval) ORDER BY o)
                              FROM unnest(floor_at) WITH ORDINALITY AS u (f, o)), '{}')
RETURNING final_until;
