-- The scrape's read of the lazy reminders due without a state row
-- (unpromoted_test.go). Test-only SQL: a table in the lazy layout after
-- schema 44, built by bulk statements instead of intake (as
-- internal/store/testdata/longtx.sql).

-- name: Fill
-- @n lazy reminders due uniformly over [@from, @to) in random order
-- (channels alternating, 16 tenants), without state rows.
INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key,
                       created_at, lazy)
SELECT 'tenant-' || (i % 16), 'fill-' || i, t.channel,
       CASE WHEN t.channel = 'sms' THEN '+1415' || lpad(i::text, 7, '0') ELSE 'u' || i || '@example.com' END,
       'course-expiry', '{}'::jsonb, t.due_at, t.due_at + interval '1 day',
       'nudge-' || md5('fill-' || i), @from::timestamptz - interval '3 days', true
  FROM generate_series(1, @n::bigint) AS i,
       LATERAL (SELECT CASE WHEN i % 2 = 0 THEN 'sms' ELSE 'email' END AS channel,
                       @from::timestamptz + random() * (@to::timestamptz - @from::timestamptz) AS due_at) t;

-- name: Delivered
-- The state rows of the lazy reminders due before @before, delivered: what
-- the promoter, the claim and the workers left of them (the history a
-- scrape must not read); those that have one keep it.
INSERT INTO reminder_state (id, tenant, channel, state, fence, due_at, deadline, updated_at, finished_at,
                            claimed_at, claimed_fence, claimed_by, started_at, started_fence, started_by,
                            delivered_by, attempts, enqueued_at, dispatch_batch)
SELECT r.id, r.tenant, r.channel, 'delivered', 2, r.due_at, r.deadline, r.due_at, r.due_at, r.due_at, 1,
       'dispatcher', r.due_at, 2, 'worker', 'worker', 1, r.due_at, 1
  FROM reminders r
 WHERE r.lazy AND r.due_at < @before::timestamptz
 ORDER BY r.due_at, r.id
    ON CONFLICT (id) DO NOTHING;

-- name: Pending
-- The state rows of the lazy reminders due in [@from, @to), pending: what
-- the promoter leaves before the claim.
INSERT INTO reminder_state (id, tenant, channel, state, fence, due_at, deadline)
SELECT r.id, r.tenant, r.channel, 'pending', 0, r.due_at, r.deadline
  FROM reminders r
 WHERE r.lazy AND r.due_at >= @from::timestamptz AND r.due_at < @to::timestamptz
 ORDER BY r.due_at, r.id;

-- name: Watermark
-- The promoter's row: @final and @prov, no sweep in progress.
UPDATE nudge_promoter
   SET final_until = @final, prov_until = @prov, prov_wait = '{}', sweep_until = NULL, sweep_wait = NULL,
       sweep_prev_done = NULL, cursor_due = NULL, cursor_id = NULL, passed_at = @prov::timestamptz - interval '1 hour',
       ahead = interval '1 hour';

-- name: Expected
-- What the gauges must show of the lazy reminders due by @now without a
-- state row from @from on: counted by channel, and the oldest.
SELECT r.channel, count(*), min(r.due_at)
  FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id
 WHERE r.lazy AND s.id IS NULL AND r.due_at >= @from::timestamptz AND r.due_at <= @now::timestamptz
 GROUP BY 1 ORDER BY 1;

-- name: Schema39Body
-- Schema 39's nudge_unpromoted_due(@due_by) body, as a statement: what the
-- scrape read before schema 43 (BenchmarkScrapeOfADownDispatcher's
-- contrast).
SELECT r.channel, r.tenant, count(*), min(r.due_at), min(r.deadline) FILTER (WHERE r.deadline <= @due_by)
  FROM reminders r
 WHERE r.lazy
   AND r.due_at >= (SELECT p.final_until FROM nudge_promoter p)
   AND r.due_at <= @due_by
   AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)
 GROUP BY r.channel, r.tenant;
