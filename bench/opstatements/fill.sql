-- The 400k reminders of the fixture, shared by both layouts (then fill_old.sql or fill_new.sql);
-- :schema names the schema. Campaign 7 (tenant-3) owns 50,000 of them in runs of 200 ids (a
-- planner slice each), campaign 8 10,000; the states are spread over every row by hash.
SET search_path = :schema;
SET session_replication_role = replica; -- no trigger, no FK check: the rows are consistent by construction
CREATE TEMP TABLE gen AS
SELECT i,
       CASE WHEN (i / 200) % 8 = 3 THEN 'tenant-3' WHEN (i / 200) % 40 = 5 THEN 'tenant-3' ELSE 'tenant-' || (i % 16) END AS tenant,
       CASE WHEN (i / 200) % 8 = 3 THEN 'campaign:7:' || lpad(i::text, 8, '0')
            WHEN (i / 200) % 40 = 5 THEN 'campaign:8:' || lpad(i::text, 8, '0')
            ELSE 'scale:' || i END AS key,
       CASE WHEN i % 2 = 0 THEN 'sms' ELSE 'email' END AS channel,
       CASE WHEN h < 70 THEN 'delivered' WHEN h < 82 THEN 'pending' WHEN h < 85 THEN 'failed'
            WHEN h < 86 THEN 'quarantined' WHEN h < 89 THEN 'canceled' WHEN h < 92 THEN 'expired'
            WHEN h < 95 THEN 'retrying' WHEN h < 97 THEN 'enqueued' WHEN h < 98 THEN 'sending'
            ELSE 'leased' END AS state,
       timestamptz '2026-11-01' + i * interval '10 seconds' AS due_at
  FROM generate_series(1, 400000) i,
       LATERAL (SELECT abs(hashint8(i)) % 100 AS h) x;
INSERT INTO campaign_sources (name, tenant, relation, key_column, recipient_column)
VALUES ('src', 'tenant-3', 'reminders'::regclass, 'key', 'recipient');
INSERT INTO campaigns (id, tenant, name, channel, template, source, due_at, deadline, lease, state, planned)
OVERRIDING SYSTEM VALUE VALUES (7, 'tenant-3', 'c7', 'email', 't', 'src', '2026-11-01', '2027-01-01', '1 minute', 'done', 50000),
       (8, 'tenant-3', 'c8', 'email', 't', 'src', '2026-11-01', '2027-01-01', '1 minute', 'done', 10000);
