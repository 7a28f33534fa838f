-- A due-ordered store for the spread claim (issue 18), measured before
-- building it: BenchmarkDueOrder and TestDueOrderPromote
-- (dueorder_bench_test.go). Test-only SQL: a prototype, not Nudge's schema
-- (no migration creates these objects; schema/transitions_test.go skips
-- testdata).
--
-- "Lazy" layout: a reminder due beyond a horizon gets no reminder_state row
-- at intake; the wide reminders row keeps the intent as recorded, and a
-- covering index on its due_at is the due-ordered store of the cold ones. A
-- promoter inserts the state rows of a due range in due order, so the state
-- rows of one minute share heap pages whatever the table's size. Every
-- statement runs on a schema after the rollout (schema version 35: no
-- mirror), as this release's binaries then run.

-- name: DeferredIndexes
-- The unique constraints and secondary indexes of reminders and
-- reminder_state that a bulk load drops and rebuilds (drop, build), as
-- nudge-bench's scale tables do; reminders' primary key stays (the
-- identity appends to it), reminder_state's goes (HistoryFill inserts in due
-- order, random ids). A partial index of reminder_state that no pending row
-- enters stays during the load (a row that enters none costs it its
-- predicate only).
SELECT 'ALTER TABLE reminder_state DROP CONSTRAINT reminder_state_pkey',
       'ALTER TABLE reminder_state ADD CONSTRAINT reminder_state_pkey PRIMARY KEY (id)'
UNION ALL
SELECT 'ALTER TABLE reminders DROP CONSTRAINT ' || quote_ident(conname),
       'ALTER TABLE reminders ADD CONSTRAINT ' || quote_ident(conname) || ' ' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE conrelid = 'reminders'::regclass AND contype = 'u'
UNION ALL
SELECT 'DROP INDEX ' || i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
  FROM pg_index i
 WHERE i.indrelid IN ('reminders'::regclass, 'reminder_state'::regclass) AND NOT i.indisprimary
   AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
   AND (i.indpred IS NULL OR pg_get_expr(i.indpred, i.indrelid) LIKE '%pending%');

-- name: DueFill
-- Rows @first..@last of @total reminders, as layouts.sql's SpreadFill: all
-- pending, scheduled for later (over the 30 days after tomorrow, random
-- order, channels alternating, 16 tenants), and every (@total / @due)th of
-- them an SMS due in the hour before @now (between 60 and 10 minutes
-- before), so the due rows are spread evenly over the heap.
INSERT INTO reminders (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key,
                       created_at)
SELECT 'tenant-' || (i % 16), 'spread:' || i, t.channel,
       CASE WHEN t.channel = 'sms' THEN '+1415' || lpad((i % 10000000)::text, 7, '0') ELSE 'u' || i || '@example.com' END,
       'course-expiry', '{"course": "Go 101"}'::jsonb, t.due_at,
       CASE WHEN t.is_due THEN @now::timestamptz + interval '2 hours' ELSE t.due_at + interval '1 day' END,
       'nudge-' || lpad(to_hex(i), 64, '0'), @now::timestamptz - interval '1 day'
  FROM generate_series(@first::bigint, @last::bigint) AS i,
       LATERAL (SELECT i % (@total::bigint / @due::bigint) = 0 AS is_due) d,
       LATERAL (SELECT d.is_due,
                       CASE WHEN d.is_due OR i % 2 = 0 THEN 'sms' ELSE 'email' END AS channel,
                       CASE WHEN d.is_due THEN @now::timestamptz - interval '1 hour' + random() * interval '50 minutes'
                            ELSE @now::timestamptz + interval '1 day' + random() * interval '30 days' END AS due_at) t;

-- name: StateFill
-- Today's layout after the rollout: every reminder has its state row, made
-- at intake, so the state rows lie in intake (id) order: rows @first..@last
-- of the id range.
INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days,
                            updated_at)
SELECT r.id, r.tenant, r.channel, r.due_at, r.deadline, r.tz, r.window_open, r.window_close, r.window_days,
       r.created_at
  FROM reminders r
 WHERE r.id BETWEEN @first AND @last
 ORDER BY r.id;

-- name: DueOrderIndex
-- The due-ordered store of the reminders without a state row: what the
-- promoter reads, index-only once the visibility map is set. The prototype's
-- lazy intake (a trigger) leaves reminders.lazy false, so it replaces schema
-- 38's partial index (WHERE lazy) with the unfiltered one it measured.
DROP INDEX IF EXISTS reminders_due_order;
CREATE INDEX reminders_due_order ON reminders (due_at)
    INCLUDE (id, tenant, channel, deadline, tz, window_open, window_close, window_days);

-- name: Promote
-- The promoter: the state rows of the reminders due in [@from, @until), in
-- due order; a reminder that has one (made at intake because it was due
-- soon, or materialized by a write) keeps it.
INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days)
SELECT r.id, r.tenant, r.channel, r.due_at, r.deadline, r.tz, r.window_open, r.window_close, r.window_days
  FROM reminders r
 WHERE r.due_at >= @from::timestamptz AND r.due_at < @until::timestamptz
 ORDER BY r.due_at
    ON CONFLICT (id) DO NOTHING;

-- name: Materialize
-- What a write to a reminder not yet promoted (cancel, update, reschedule,
-- operator expire) would run first: its state row, as intake would have made
-- it, unless it has one.
INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days)
SELECT r.id, r.tenant, r.channel, r.due_at, r.deadline, r.tz, r.window_open, r.window_close, r.window_days
  FROM reminders r
 WHERE r.id = ANY(@ids::bigint[])
    ON CONFLICT (id) DO NOTHING;

-- name: LazyIntakeOn
-- Lazy intake without changing intake's statement: a trigger drops the state
-- row of a reminder due at or after the horizon (dueorder_horizon, set by
-- SetHorizon), unless the transaction says it promotes (SET LOCAL
-- dueorder.promoter = on). The bench takes it away (LazyIntakeOff) before
-- it promotes. The trigger costs a plpgsql call per row that the built
-- design would not.
CREATE TABLE IF NOT EXISTS dueorder_horizon (at timestamptz NOT NULL);
CREATE OR REPLACE FUNCTION dueorder_lazy_intake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.due_at >= (SELECT h.at FROM dueorder_horizon h)
       AND coalesce(current_setting('dueorder.promoter', true), '') <> 'on' THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER dueorder_lazy_intake BEFORE INSERT ON reminder_state
    FOR EACH ROW EXECUTE FUNCTION dueorder_lazy_intake();

-- name: SetHorizon
WITH gone AS (DELETE FROM dueorder_horizon)
INSERT INTO dueorder_horizon (at) VALUES (@at);

-- name: LazyIntakeOff
DROP TRIGGER IF EXISTS dueorder_lazy_intake ON reminder_state;

-- name: HistoryFill
-- The lazy layout in its steady state: reminder_state also holds the rows
-- of the reminders delivered over the retention window (30 days by
-- default), which the promoter inserted in due order, so their ids are
-- random in its primary key. Stood in for by a terminal state row for each
-- reminder scheduled for later (the promoter's ranges never reach them),
-- inserted in due order.
INSERT INTO reminder_state (id, tenant, channel, state, fence, due_at, deadline, tz, window_open, window_close,
                            window_days, updated_at, finished_at, claimed_at, claimed_fence, claimed_by,
                            started_at, started_fence, started_by, delivered_by, attempts, enqueued_at,
                            dispatch_batch)
SELECT r.id, r.tenant, r.channel, 'delivered', 2, r.due_at, r.deadline, r.tz, r.window_open, r.window_close,
       r.window_days, r.due_at - interval '31 days', r.due_at - interval '31 days', r.due_at - interval '31 days', 1,
       'dispatcher', r.due_at - interval '31 days', 2, 'worker', 'worker', 1, r.due_at - interval '31 days', 1
  FROM reminders r
 WHERE r.due_at > @now::timestamptz
 ORDER BY r.due_at;

-- name: LostBelowWatermark
-- The promoter's invariant (schema 38's nudge_promoter, internal/store
-- Promote; the prototype's race promoter became those statements): no
-- committed reminder due below the final watermark without its state row.
SELECT count(*) FROM reminders r, nudge_promoter p
 WHERE r.due_at < p.final_until
   AND NOT EXISTS (SELECT 1 FROM reminder_state s WHERE s.id = r.id);
