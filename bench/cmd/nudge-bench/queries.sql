-- Every statement the harness itself runs (Nudge's own statements come from
-- internal/store): what it seeds, how it tells a run is over, and how it
-- turns the event trail into rates and latencies. Parsed by
-- internal/sqlfile; the Go code names each one it runs. The event trail is
-- the view reminder_timeline (schema version 30): the events stored in
-- reminder_events and those the happy path folds into the reminder's row,
-- with the same columns, so every figure is computed as before. What
-- measures state (how many reminders are terminal, delivered, due, and the
-- times of their moves) reads reminder_state (schema version 32: the state
-- columns, mirrored from reminders until the next release drops them
-- there). The bench measures the release after its rollout, lazy intake on
-- (migrate in sql.go): the end-to-end, latency and burst seeds are due
-- within lazy intake's horizon, so intake gives each its state row and what
-- the harness moves goes to reminder_state; the scale tables are lazy, their
-- state rows the promoter's (ScaleFill).

-- ---------------------------------------------------------------- progress

-- name: TerminalCount
-- The end-to-end runs poll this until every reminder reached a terminal state.
-- The measured reminders are those numbered below @below (warmIDBase); the
-- warm-up's are numbered from it (WarmupIDs).
SELECT count(*) FROM reminder_state WHERE state IN ('delivered', 'failed', 'expired', 'canceled') AND id < @below;

-- name: WarmupTerminal
-- The warm-up's reminders (numbered from @below) in a terminal state.
SELECT count(*) FROM reminder_state WHERE state IN ('delivered', 'failed', 'expired', 'canceled') AND id >= @below;

-- name: WarmupIDs
-- The warm-up's reminders and events are numbered from @base, above the
-- measured ones that SeedCopy copies afterwards with their template's numbers.
SELECT setval(pg_get_serial_sequence('reminders', 'id'), @base),
       setval(pg_get_serial_sequence('reminder_events', 'id'), @base);

-- name: StateCounts
-- How many reminders were published (the broker confirmed them: the
-- dispatcher records one confirmation per batch; each reminder is published
-- once in these runs), and how many are terminal.
SELECT (SELECT coalesce(sum(confirmed), 0) FROM publish_confirms),
       count(*) FILTER (WHERE state IN ('delivered', 'failed', 'expired', 'canceled'))
  FROM reminder_state;

-- name: DeliveredCount
SELECT count(*) FROM reminder_state WHERE state = 'delivered' AND id < @below;

-- name: RiverCompleted
-- The jobs of @queue completed (the measured jobs are in the default queue,
-- the warm-up's in a queue of their own).
SELECT count(*) FROM river_job WHERE state = 'completed' AND queue = @queue;

-- ------------------------------------------------------------ throughput

-- name: E2ESpan
-- First claim to last terminal state, from the event trail (the measured
-- reminders only: numbered below @below).
SELECT min(at) FILTER (WHERE from_state = 'pending' AND to_state = 'enqueued'),
       max(at) FILTER (WHERE to_state IN ('delivered', 'failed', 'expired', 'canceled'))
  FROM reminder_timeline
 WHERE reminder_id < @below;

-- name: RiverSeedCopy
-- A River run's jobs: the first @n jobs of the template schema %s (quoted by
-- the caller), which River's InsertMany filled once (riverSeedTemplate),
-- copied in their order into @queue and stored as InsertMany stores them
-- (JobInsertFastMany in riverqueue/river): created now, and `available`
-- scheduled now or, with @scheduled_at, `scheduled` at that time (what
-- InsertOpts.ScheduledAt does).
INSERT INTO river_job (args, kind, max_attempts, metadata, priority, queue, tags, created_at, scheduled_at, state)
SELECT args, kind, max_attempts, metadata, priority, @queue, tags, now(),
       coalesce(@scheduled_at::timestamptz, now()),
       (CASE WHEN @scheduled_at::timestamptz IS NULL THEN 'available' ELSE 'scheduled' END)::river_job_state
  FROM %[1]s.river_job
 ORDER BY id
 LIMIT @n;

-- name: RiverSpan
SELECT min(attempted_at), max(finalized_at) FROM river_job WHERE queue = @queue;

-- name: ClaimToTerminal
-- Per reminder, its claim event to its terminal event (ms): p50, p99, max.
WITH l AS (
    SELECT reminder_id,
           max(at) FILTER (WHERE to_state IN ('delivered', 'failed', 'expired', 'canceled'))
         - min(at) FILTER (WHERE from_state = 'pending' AND to_state = 'enqueued') AS d
      FROM reminder_timeline WHERE reminder_id < @below GROUP BY reminder_id)
SELECT extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY d)) * 1000,
       extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY d)) * 1000,
       extract(epoch FROM max(d)) * 1000
  FROM l;

-- --------------------------------------------------------------- latency

-- name: ShiftDue
-- The latency run seeds its stream through intake with due times far ahead,
-- then moves the whole stream to start at @start: seeding takes longer than
-- the lead a stream can be given, and the intake must not share the
-- measured seconds. The state row holds due_at and deadline (the claim
-- reads them there; the seed is due within lazy intake's horizon, so every
-- reminder has one: streamRun checks LazySeeded); with migration 32's
-- mirror on, it copies them back to reminders.
UPDATE reminder_state SET due_at = due_at + (@start::timestamptz - @seeded::timestamptz),
                          deadline = deadline + (@start::timestamptz - @seeded::timestamptz);

-- name: LazySeeded
-- Reminders intake left without their state row (due past lazy intake's
-- horizon): ShiftDue would not move them.
SELECT count(*) FROM reminders WHERE lazy;

-- name: VacuumAfterShift
-- After ShiftDue, before the stream starts: the moved state rows' dead
-- versions vacuumed and both tables analyzed, so the claims do not meet them.
VACUUM ANALYZE reminders, reminder_state;

-- name: Hops
-- Per reminder, the time of each step: due_at (the row), claimed (the
-- dispatcher's claim event, at the claim statement's start), enqueued (its
-- batch's publish confirmation: the dispatcher's clock once the broker
-- confirmed the whole batch, before it records it), sending (the worker's
-- claim of the attempt) and the terminal state (the worker's clock before
-- recording the outcome). A worker may claim a message before its batch's
-- confirmation is recorded (the design allows it: the message proves the
-- publish), so enqueue→start can be below zero. Each hop's count, how many
-- were below zero, p50, p90, p99 and max in ms; then, on every row, how many
-- reminders a worker started before their batch's confirmation, and how
-- many have no confirmation recorded (their dispatcher pass failed).
WITH ev AS (
    SELECT m.due_at, c.confirmed_at AS enqueued,
           min(e.at) FILTER (WHERE e.from_state = 'pending' AND e.to_state = 'enqueued') AS claimed,
           min(e.at) FILTER (WHERE e.to_state = 'sending') AS started,
           max(e.at) FILTER (WHERE e.to_state IN ('delivered', 'failed', 'expired', 'canceled')) AS done
      FROM reminder_state m
      JOIN reminder_timeline e ON e.reminder_id = m.id
      LEFT JOIN publish_confirms c ON c.batch = m.dispatch_batch
     WHERE m.due_at >= @from -- the measured reminders: a warm-up's are due before
     GROUP BY m.id, m.due_at, c.confirmed_at
), h AS (
    SELECT 'due_to_claim' AS hop, claimed - due_at AS d FROM ev
    UNION ALL SELECT 'claim_to_enqueue', enqueued - claimed FROM ev
    UNION ALL SELECT 'enqueue_to_start', started - enqueued FROM ev
    UNION ALL SELECT 'start_to_terminal', done - started FROM ev
    UNION ALL SELECT 'enqueue_to_terminal', done - enqueued FROM ev
    UNION ALL SELECT 'end_to_end', done - due_at FROM ev
)
SELECT hop, count(d), count(*) FILTER (WHERE d < interval '0'),
       extract(epoch FROM percentile_cont(0.5) WITHIN GROUP (ORDER BY d)) * 1000,
       extract(epoch FROM percentile_cont(0.9) WITHIN GROUP (ORDER BY d)) * 1000,
       extract(epoch FROM percentile_cont(0.99) WITHIN GROUP (ORDER BY d)) * 1000,
       extract(epoch FROM max(d)) * 1000,
       (SELECT count(*) FILTER (WHERE started < enqueued) FROM ev),
       (SELECT count(*) FILTER (WHERE enqueued IS NULL) FROM ev)
  FROM h GROUP BY hop;

-- name: StreamSpan
-- The latency run's delivered rate: the measured reminders (those due from
-- @from: a warm-up's are due before) over first due → last terminal.
SELECT count(*) FILTER (WHERE state = 'delivered'), min(due_at), max(finished_at)
  FROM reminder_state WHERE due_at >= @from;

-- ----------------------------------------------------------------- scale

-- name: ScaleFill
-- Rows @first..@last of a table of @size reminders in all, the one layout
-- of the scale (claim) and scrape sections, which share each table, as
-- production holds it once lazy intake is on (schema 44, after the rollout):
-- every row is lazy (reminders.lazy, in the partial index
-- reminders_due_order) and none has a reminder_state row; the promoter
-- (store.Promote, scale.go's promoteTables) inserts the state rows of the
-- due sets, in due order, before the claims. Two sets of @due rows each are
-- SMS due before @now: the "clustered" set is a block of consecutive ids in
-- the middle of the table (@block onwards), due first, one after the other
-- over the 50 minutes from two hours before @now (the scrape's backlog is
-- its first rows: the scrape's clock stops where they end); the "spread"
-- set is spread evenly over the rest of the id range, as reminders
-- scheduled on different days are, due in the hour before @now. Every other
-- row is scheduled for later, over the 30 days after tomorrow (as a SaaS
-- that schedules ahead holds them: issue 18), channels alternating. The
-- idempotency key is a stand-in of the real key's width (the claim returns
-- it and nothing checks it), so the load costs no SHA-256 per row.
INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key,
                       created_at, lazy)
SELECT 'tenant-' || (i % 16), 'scale:' || i, t.channel,
       CASE WHEN t.channel = 'sms' THEN '+1415' || lpad((i % 10000000)::text, 7, '0') ELSE 'u' || i || '@example.com' END,
       'course-expiry', '{"course": "Go 101"}'::jsonb, t.due_at,
       CASE WHEN t.is_due THEN @now::timestamptz + interval '2 hours' ELSE t.due_at + interval '1 day' END,
       'nudge-' || lpad(to_hex(i), 64, '0'), @now::timestamptz - interval '1 day', true
  FROM generate_series(@first::bigint, @last::bigint) AS i,
       -- j numbers the rows outside the block 1..@size-@due
       LATERAL (SELECT i >= @block::bigint AND i < @block::bigint + @due::bigint AS clustered,
                       CASE WHEN i < @block::bigint THEN i ELSE i - @due::bigint END AS j,
                       @size::bigint - @due::bigint AS rest) b,
       LATERAL (SELECT NOT b.clustered AND (b.j * @due::bigint / b.rest) <> ((b.j - 1) * @due::bigint / b.rest) AS spread) s,
       LATERAL (SELECT b.clustered OR s.spread AS is_due,
                       CASE WHEN b.clustered OR s.spread OR i % 2 = 0 THEN 'sms' ELSE 'email' END AS channel,
                       CASE WHEN b.clustered
                            THEN @now::timestamptz - interval '2 hours' + (i - @block::bigint) * interval '50 minutes' / @due::bigint
                            WHEN s.spread
                            THEN @now::timestamptz - interval '1 hour' + b.j * interval '50 minutes' / b.rest
                            ELSE @now::timestamptz + interval '1 day' + (i % 2592000) * interval '1 second' END AS due_at) t;

-- name: ScaleUniqueConstraints
-- The unique constraints of reminders (their indexes are built after the load),
-- with the number of key columns their index compares under a collation
-- (the costly comparisons of a build: fillScaleTable builds those first; a
-- text_pattern_ops column compares bytes).
SELECT c.conname, pg_get_constraintdef(c.oid), NULL::text, 'reminders',
       (SELECT count(*) FROM unnest(i.indcollation::oid[], i.indclass::oid[]) AS k(coll, opc)
          JOIN pg_opclass o ON o.oid = k.opc
         WHERE k.coll <> 0 AND o.opcname NOT LIKE '%pattern_ops')::int
  FROM pg_constraint c JOIN pg_index i ON i.indexrelid = c.conindid
 WHERE c.conrelid = 'reminders'::regclass AND c.contype = 'u'
 ORDER BY c.conname;

-- name: ScaleSecondaryIndexes
-- The other indexes of reminders and of its state rows (reminder_state,
-- schema version 32) except the primary keys (kept: the identity appends to
-- them cheaply, and other tables reference them), with the predicate of a
-- partial one, the table it indexes and its key columns compared under a
-- collation.
SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid), pg_get_expr(i.indpred, i.indrelid),
       i.indrelid::regclass::text,
       (SELECT count(*) FROM unnest(i.indcollation::oid[], i.indclass::oid[]) AS k(coll, opc)
          JOIN pg_opclass o ON o.oid = k.opc
         WHERE k.coll <> 0 AND o.opcname NOT LIKE '%pattern_ops')::int
  FROM pg_index i
 WHERE i.indrelid IN ('reminders'::regclass, 'reminder_state'::regclass) AND NOT i.indisprimary
   AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
 ORDER BY 4, 1;

-- name: ScaleShape
-- What the built table holds, before the promotion: reminders, those due by
-- @now (both due sets), those not lazy (none: every one is), the state rows
-- (none), and the size with indexes and TOAST of reminders and
-- reminder_state together.
SELECT count(*), count(*) FILTER (WHERE due_at <= @now), count(*) FILTER (WHERE NOT lazy),
       (SELECT count(*) FROM reminder_state),
       pg_total_relation_size('reminders') + pg_total_relation_size('reminder_state')
  FROM reminders;

-- name: ScalePromoterFrom
-- The promoter's watermark of a dispatcher whose last pass ran before the
-- table's reminders were written (@from: their created_at): no sweep in
-- progress, nothing provisional. The migration set final_until to its own
-- clock, after the due sets' due times, which would leave them below the
-- final watermark without their state rows: a state no dispatcher leaves.
UPDATE nudge_promoter
   SET final_until = @from, prov_until = NULL, prov_wait = '{}', floor_wait = NULL, floor_at = NULL,
       sweep_until = NULL, sweep_wait = NULL, sweep_prev_done = NULL, cursor_due = NULL, cursor_id = NULL,
       passed_at = NULL, ahead = NULL;

-- name: DatabaseClock
SELECT statement_timestamp();

-- name: BackendPID
SELECT pg_backend_pid();

-- name: ScalePromoted
-- What the promotion left (scale.go checks it): state rows, those pending
-- and due by @now, lazy reminders due by @now still without their state row
-- (whatever the watermark says: none), the final watermark, and how many
-- reminders nudge_unpromoted_due (the scrape's and nudgectl stats' read)
-- finds due by @now without a state row.
SELECT (SELECT count(*) FROM reminder_state),
       (SELECT count(*) FROM reminder_state WHERE state = 'pending' AND due_at <= @now),
       (SELECT count(*) FROM reminders r
         WHERE r.lazy AND r.due_at <= @now AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)),
       (SELECT final_until FROM nudge_promoter),
       (SELECT coalesce(sum(n), 0)::bigint FROM nudge_unpromoted_due(@now));

-- name: CountEveryOpenRow
-- What the DB collector counted per scrape before migration 0023: every open
-- row, those scheduled for later included, in this layout (lazy: a reminder
-- not yet promoted has no state row and is pending): the state rows by
-- channel and state, and the lazy reminders without one.
SELECT channel, state, count(*) FROM reminder_state
 WHERE state IN ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined')
 GROUP BY 1, 2
UNION ALL
SELECT r.channel, 'pending', count(*) FROM reminders r
 WHERE r.lazy AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id)
 GROUP BY 1;

-- name: WALHold
-- A temporary physical replication slot, reserving the WAL from now on until
-- its session ends: the run's segments stay until pg_waldump has read them.
SELECT pg_create_physical_replication_slot($1, true, true);

-- name: WALPosition
-- The cluster's WAL insert position, before a run.
SELECT pg_current_wal_lsn()::text;

-- name: WALSince
-- After a run: the insert position, the bytes written since $1, the data
-- directory (pg_wal is under it; superuser or pg_read_all_settings), and
-- the files of the run's schema as WAL records name them
-- (tablespace/database/filenode): its relations, their TOAST tables and
-- the TOAST tables' indexes.
WITH own AS (
    SELECT oid FROM pg_class WHERE relnamespace = current_schema()::regnamespace
), toast AS (
    SELECT reltoastrelid AS oid FROM pg_class WHERE relnamespace = current_schema()::regnamespace AND reltoastrelid <> 0
), rels AS (
    SELECT oid FROM own UNION SELECT oid FROM toast
    UNION SELECT indexrelid FROM pg_index WHERE indrelid IN (SELECT oid FROM toast)
)
SELECT pg_current_wal_lsn()::text, pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8,
       current_setting('data_directory'),
       coalesce(array_agg(
           (CASE WHEN c.reltablespace = 0 THEN (SELECT dattablespace FROM pg_database WHERE datname = current_database())
                 ELSE c.reltablespace END)::text
           || '/' || (SELECT oid FROM pg_database WHERE datname = current_database())::text
           || '/' || pg_relation_filenode(c.oid)::text) FILTER (WHERE pg_relation_filenode(c.oid) IS NOT NULL), '{}')
  FROM rels JOIN pg_class c ON c.oid = rels.oid;

-- name: LeftoverScaleSchemas
-- Schemas a killed run could not drop (the scale tables are gigabytes).
SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench\_scale\_%';

-- ----------------------------------------------------------- diagnostics

-- name: ActiveBackends
-- The -diagnose sampler: active backends of this database by statement and wait event.
SELECT query, coalesce(wait_event_type || ':' || wait_event, 'CPU')
  FROM pg_stat_activity
 WHERE state = 'active' AND pid <> pg_backend_pid() AND datname = current_database();

-- name: EnqueuedSample
SELECT id, fence FROM reminder_state WHERE state = 'enqueued' ORDER BY id LIMIT 50;

-- ------------------------------------------------------------ planning

-- name: PlanAudience
-- The planning section's audience: n learners with a profile, registered as
-- the source "bench" of tenant-0 (the planner reads it with its own rights).
CREATE TABLE bench_audience (id bigint PRIMARY KEY, email text NOT NULL, profile jsonb NOT NULL);
INSERT INTO bench_audience
SELECT i, 'learner-' || i || '@example.org', jsonb_build_object('course', 'Go 101', 'learner', i)
  FROM generate_series(1, @n::bigint) i;
ANALYZE bench_audience;
GRANT SELECT ON bench_audience TO nudge_planner;
SELECT nudge_campaign_source('bench', 'tenant-0', 'bench_audience', 'id', 'email', 'profile', NULL);

-- name: PlanProgress
-- A campaign's state, planned count and end (the planner's clock).
SELECT state, planned, ended_at FROM campaigns WHERE id = $1;

-- name: PlanSliceStarts
-- When each slice started (the planner's clock), in order: the cycle of a
-- slice is its start to the next one's, its queue hop included.
SELECT at FROM campaign_slices WHERE campaign_id = $1 ORDER BY slice;

-- name: NudgeScheduleOne
-- What a web tier runs per reminder (schema 1, widened by 13).
SELECT nudge_schedule($1, $2, $3, $4, $5, $6::jsonb, $7, $8);

-- name: NudgeScheduleRows
-- nudge_schedule once per row of one statement, as an import written in SQL
-- calls it (issue 18's function path: at most 1.5× the bulk statement).
SELECT count(nudge_schedule(t, k, 'email', r, 'course-expiry', d, $5, $6))
  FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[]) AS u(t, k, r, d);

-- name: NudgeScheduleMany
-- The same rows in one call of nudge_schedule_many (schema 50), as a web
-- tier in any language may send a batch: how many were created.
SELECT count(*) FILTER (WHERE status = 'created')
  FROM nudge_schedule_many($1::text[], $2::text[], array_fill('email'::text, ARRAY[cardinality($1::text[])]),
                           $3::text[], array_fill('course-expiry'::text, ARRAY[cardinality($1::text[])]),
                           $4::jsonb[], array_fill($5::timestamptz, ARRAY[cardinality($1::text[])]),
                           array_fill($6::timestamptz, ARRAY[cardinality($1::text[])]));

-- name: ReminderCount
SELECT count(*) FROM reminders;

-- -------------------------------------------------------------- seeding

-- name: SeedCopy
-- An end-to-end run's reminders, copied from the template schema the intake
-- seeded once for this N (setupNudge): the same rows and their "scheduled"
-- events, in the same order, without the intake's per-row work. The
-- template's name is %s (quoted by the caller); the identities go on where
-- the template's stop. The state rows are copied from the template's by
-- the same statement, so they exist without migration 32's mirror (which,
-- when on, finds them made); both schemas are migrated alike, so their
-- columns match.
WITH r AS (
    INSERT INTO reminders OVERRIDING SYSTEM VALUE SELECT * FROM %[1]s.reminders ORDER BY id
)
INSERT INTO reminder_state SELECT * FROM %[1]s.reminder_state ORDER BY id ON CONFLICT (id) DO NOTHING;
INSERT INTO reminder_events OVERRIDING SYSTEM VALUE SELECT * FROM %[1]s.reminder_events ORDER BY id;
SELECT setval(pg_get_serial_sequence('reminders', 'id'), (SELECT max(id) FROM reminders));
SELECT setval(pg_get_serial_sequence('reminder_events', 'id'), (SELECT max(id) FROM reminder_events));

-- ---------------------------------------------------------------- storage

-- name: StorageByTable
-- Every table of the run's schema with what it holds on disk: heap, TOAST
-- and indexes (pg_total_relation_size), after VACUUM FULL, so the figure is
-- what the rows take, not the free space their updates left behind.
SELECT c.relname, pg_total_relation_size(c.oid)
  FROM pg_class c
 WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r'
 ORDER BY c.relname;

-- name: PayloadBytes
-- The average stored size of the columns the payload window empties or masks.
SELECT coalesce(avg(pg_column_size(data) + pg_column_size(recipient)), 0) FROM reminders;
