INSERT INTO reminders (id, tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key,
                       created_at)
OVERRIDING SYSTEM VALUE SELECT i, tenant, key, channel, 'u' || i || '@example.com', 'course-expiry', '{"course": "Go 101"}'::jsonb, due_at,
       due_at + interval '2 days', 'nudge-' || lpad(to_hex(i), 64, '0'), due_at - interval '1 day'
  FROM gen;
INSERT INTO reminder_state (id, tenant, channel, state, fence, due_at, deadline, attempts, finished_at, updated_at, reason,
                            lease_until, enqueued_at, next_attempt_at)
SELECT i, tenant, channel, state, 2, due_at, due_at + interval '2 days', 1,
       CASE WHEN state IN ('delivered','failed','expired','canceled') THEN due_at + interval '1 minute' END,
       due_at + interval '1 minute',
       CASE WHEN state IN ('failed','quarantined') THEN 'provider said no' END,
       CASE WHEN state IN ('leased','enqueued','sending') THEN due_at + interval '5 minutes' END,
       CASE WHEN state = 'enqueued' THEN due_at END,
       CASE WHEN state = 'retrying' THEN due_at + interval '10 minutes' END
  FROM gen;
SELECT setval(pg_get_serial_sequence('reminders', 'id'), 400001);
VACUUM ANALYZE reminders;
VACUUM ANALYZE reminder_state;
VACUUM ANALYZE campaigns;
