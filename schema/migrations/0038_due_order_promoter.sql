-- Schema version 38: the due-ordered store, slice 1 (issue 18,
-- docs/benchmarks.md, "A due-ordered store for the spread claim, measured
-- before building it"): the column that says a reminder was left without
-- its state row, the partial index that is the due-ordered store of those
-- reminders, the promoter's watermark, and the lazy-intake setting, OFF.
--
-- A regular migration: with the setting off (as here) intake writes every
-- state row as before, so release 37's binaries run beside this release's
-- unchanged; this release's dispatcher runs a promoter pass before it
-- claims, which finds the index empty. Turning the setting on is a later
-- after-rollout step (slice 4), once no binary that JOINs reminder_state
-- without a fallback runs.
--
-- Locks. ALTER TABLE ... ADD COLUMN with a constant default is a catalogue
-- change (PostgreSQL 11+ stores the default as the column's missing value;
-- no row is rewritten: on a table of 100k rows its file node stayed the
-- same, and schema/due_order_test.go checks atthasmissing), but it takes
-- reminders' ACCESS EXCLUSIVE
-- lock. It comes first, before any other lock on a table, so nothing later
-- in this file has a lock to upgrade (schema 36 met the deadlock of a
-- SHARE lock upgraded while a fleet transaction waited on it). The index
-- build then holds the fleet's statements on reminders back while it reads
-- the table (it enters no row: every reminder is lazy = false); a large
-- install runs the pre-step of docs/deploy.md ("Schema 38") first, without
-- blocking, which IF NOT EXISTS then keeps.
ALTER TABLE reminders ADD COLUMN IF NOT EXISTS lazy boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN reminders.lazy IS
    'Written once at intake: true when intake left the reminder''s reminder_state row out (lazy intake on, '
    'due at least the horizon after the clock read after its insert), so reminders_due_order holds it '
    'and the promoter inserts its state row before it is due. False: the state row was written at intake, '
    'as for every reminder before schema 38. Never updated.';

-- The due-ordered store: partial, so a reminder that got its state row at
-- intake (every one while the setting is off, and the ones due soon, the
-- 09:00 burst, after) costs intake no index entry: the WAL bar of make
-- bench has no room for one. The key is (due_at, id) so a promoter pass is
-- bounded by a keyset; the rest is what a state row is made of, so the
-- promoter reads it index-only.
CREATE INDEX IF NOT EXISTS reminders_due_order ON reminders (due_at, id)
    INCLUDE (tenant, channel, deadline, tz, window_open, window_close, window_days)
    WHERE lazy;
COMMENT ON INDEX reminders_due_order IS
    'The due-ordered store of the reminders intake left without a state row (lazy): the promoter '
    '(internal/store Promote) reads it in (due_at, id) order, index-only, and inserts their state rows '
    'ahead of their due time, so the state rows of one minute share pages whatever the table''s size.';

-- The lazy-intake setting: one row, the horizon (2H) as an interval; NULL
-- is off. Intake (pkg/intake ScheduleMany, nudge_try_schedule_unchecked)
-- leaves the state row out only for a reminder due at least the horizon
-- after clock_timestamp() read inside its insert into reminders, i.e. after
-- the insert's lock on the table (the promoter's race argument needs the
-- database's clock on both sides and the lock before the clock).
CREATE TABLE IF NOT EXISTS nudge_lazy_intake (
    singleton boolean  PRIMARY KEY DEFAULT true CHECK (singleton),
    horizon   interval CHECK (horizon > interval '0')
);
INSERT INTO nudge_lazy_intake (singleton, horizon) VALUES (true, NULL) ON CONFLICT DO NOTHING;
COMMENT ON TABLE nudge_lazy_intake IS
    'Lazy intake: horizon NULL (off, as schema 38 leaves it) or the 2H of the due-ordered store: a reminder '
    'due at least horizon after intake''s clock gets no state row at intake (reminders.lazy). Never lower it '
    'below the dispatchers'' promoter horizon (--promote-ahead): a pass promotes at most '
    'least(that, horizon) ahead of the database''s clock. Turned on by an after-rollout step only.';

-- The promoter's watermark: one row. Below final_until every committed
-- lazy reminder has its state row. A sweep promotes [final_until,
-- sweep_until) in (due_at, id) order, in bounded passes (the keyset cursor
-- after which the next pass reads); sweep_wait are the transactions
-- (virtual ids) that held a write lock on reminders at the sweep's first
-- pass, read from pg_locks before that pass's snapshot. A reminder in the
-- range is committed before that read (seen by every pass of the sweep),
-- or written by one of sweep_wait, or by a transaction that took its lock
-- after the read, whose lazy reminders are due at least the horizon after
-- its clock, past sweep_until. So once a sweep completes, its end becomes
-- prov_until and its writers prov_wait, and final_until moves to prov_until
-- when the next sweep completes, if prov_wait were all done before that
-- sweep began (sweep_prev_done). A long web transaction costs re-scans,
-- never a loss, never a blocked intake (docs/benchmarks.md, the race).
CREATE TABLE IF NOT EXISTS nudge_promoter (
    singleton       boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    final_until     timestamptz NOT NULL,
    prov_until      timestamptz,
    prov_wait       text[]      NOT NULL DEFAULT '{}',
    sweep_until     timestamptz,
    sweep_wait      text[],
    sweep_prev_done boolean,
    cursor_due      timestamptz,
    cursor_id       bigint,
    passed_at       timestamptz,
    ahead           interval,
    CHECK ((sweep_until IS NULL) = (cursor_due IS NULL) AND (cursor_due IS NULL) = (cursor_id IS NULL)
           AND (sweep_until IS NULL) = (sweep_wait IS NULL) AND (sweep_until IS NULL) = (sweep_prev_done IS NULL))
);
INSERT INTO nudge_promoter (singleton, final_until) VALUES (true, now()) ON CONFLICT DO NOTHING;
COMMENT ON TABLE nudge_promoter IS
    'The promoter''s watermark (internal/store Promote, one row): final_until (below it every committed '
    'lazy reminder has its state row), prov_until and prov_wait (the last complete sweep''s end and the '
    'writers on reminders in flight at its start), and the sweep in progress: its end, writers, whether '
    'prov_wait were done at its start, and the keyset cursor (cursor_due, cursor_id); passed_at and ahead '
    '(H) of the last pass, for the gauges (lag: now + ahead - provisional end). Passes serialize on this row '
    '(FOR UPDATE).';

-- What a dispatcher run promoted, and the watermarks after its passes
-- (metrics and nudgectl stats read them beside the run's counts).
ALTER TABLE dispatch_runs ADD COLUMN IF NOT EXISTS promoted integer NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS final_until timestamptz,
    ADD COLUMN IF NOT EXISTS prov_until timestamptz;
COMMENT ON COLUMN dispatch_runs.promoted IS 'State rows the run''s promoter passes inserted (schema 38).';
COMMENT ON COLUMN dispatch_runs.prov_until IS
    'The promoter''s provisional end after the run: every lazy reminder visible due before it had its '
    'state row, so the run claimed up to min(cutoff, prov_until); NULL: no lazy reminder beyond, no bound.';

-- Intake's body (version 34's), with the lazy decision: the state row is
-- left out when the setting is on and the reminder is due at least the
-- horizon after clock_timestamp() read inside the INSERT into reminders,
-- after its lock on the table. The duplicate comparison reads the state row
-- when there is one and else the wide row's recorded intent (a lazy
-- reminder not yet promoted is as intake wrote it).
CREATE OR REPLACE FUNCTION nudge_try_schedule_unchecked(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz,
    p_actor text DEFAULT 'intake',
    p_tz text DEFAULT NULL, p_due_local timestamp DEFAULT NULL, p_deadline_local timestamp DEFAULT NULL,
    p_window_open time DEFAULT NULL, p_window_close time DEFAULT NULL, p_window_days integer DEFAULT NULL,
    OUT id bigint, OUT status text, OUT field text, OUT reason text)
LANGUAGE plpgsql AS $$
DECLARE
    invalid text[];
    cur     record;
    due     timestamptz;
    dl      timestamptz;
    w       record;
    is_lazy boolean;
BEGIN
    invalid := nudge_invalid_local(p_tz, p_due_at, p_due_local, p_deadline, p_deadline_local,
                                   p_window_open, p_window_close, p_window_days);
    IF invalid IS NULL THEN
        due := coalesce(p_due_at, nudge_resolve_local(p_due_local, p_tz));
        dl := coalesce(p_deadline, nudge_resolve_local(p_deadline_local, p_tz));
        invalid := nudge_invalid(p_tenant, p_key, p_channel, p_recipient, p_template, p_data, due, dl);
    END IF;
    IF invalid IS NOT NULL THEN
        status := 'invalid'; field := invalid[1]; reason := invalid[2];
        RETURN;
    END IF;
    w := nudge_window_stored(p_window_open, p_window_close, p_window_days);

    INSERT INTO reminders AS t (tenant, key, channel, recipient, template, data, due_at, deadline,
                                idempotency_key, tz, window_open, window_close, window_days, lazy)
    VALUES (p_tenant, p_key, p_channel, p_recipient, p_template, COALESCE(p_data, '{}'::jsonb),
            due, dl, nudge_idempotency_key(p_tenant, p_key), p_tz, w.window_open, w.window_close, w.window_days,
            coalesce(due >= clock_timestamp() + (SELECT l.horizon FROM nudge_lazy_intake l), false))
    ON CONFLICT ON CONSTRAINT reminders_logical_key DO NOTHING
    RETURNING t.id, t.lazy INTO id, is_lazy;

    IF id IS NOT NULL THEN
        IF NOT is_lazy THEN
            -- (The constraint by name: "id" is also this function's OUT parameter.)
            INSERT INTO reminder_state AS s (id, tenant, channel, due_at, deadline, tz, window_open, window_close,
                                             window_days)
            VALUES (id, p_tenant, p_channel, due, dl, p_tz, w.window_open, w.window_close, w.window_days)
            ON CONFLICT ON CONSTRAINT reminder_state_pkey DO NOTHING;
        END IF;
        INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
        VALUES (id, NULL, 'pending', 0, p_actor, 'scheduled', 'scheduled', now());
        status := 'created';
        RETURN;
    END IF;

    SELECT r.id, coalesce(s.channel, r.channel) AS channel, r.recipient, r.template, r.data,
           CASE WHEN s.id IS NULL THEN r.due_at ELSE coalesce(s.requested_due_at, s.due_at) END AS due_at,
           CASE WHEN s.id IS NULL THEN r.deadline ELSE s.deadline END AS deadline,
           CASE WHEN s.id IS NULL THEN r.tz ELSE s.tz END AS tz,
           CASE WHEN s.id IS NULL THEN r.window_open ELSE s.window_open END AS window_open,
           CASE WHEN s.id IS NULL THEN r.window_close ELSE s.window_close END AS window_close,
           CASE WHEN s.id IS NULL THEN r.window_days ELSE s.window_days END AS window_days
      INTO cur
      FROM reminders r LEFT JOIN reminder_state s ON s.id = r.id
     WHERE r.tenant = p_tenant AND r.key = p_key;
    id := cur.id;
    IF cur.channel = p_channel AND cur.recipient = p_recipient AND cur.template = p_template
       AND cur.data = COALESCE(p_data, '{}'::jsonb)
       AND cur.due_at = due AND cur.deadline = dl
       AND coalesce(cur.tz, 'UTC') = coalesce(p_tz, 'UTC')
       AND (cur.window_open, cur.window_close, cur.window_days)
           IS NOT DISTINCT FROM (w.window_open, w.window_close, w.window_days) THEN
        status := 'exists';
    ELSE
        status := 'conflict'; field := 'key';
        reason := format('key %L of tenant %L is already scheduled with different content', p_key, p_tenant);
    END IF;
END $$;

-- Privileges. Every role that inserts reminders (pkg/intake's statement:
-- the operator, the planner, and any role a deployer granted INSERT) writes
-- lazy and reads the setting. The dispatcher runs the promoter: it reads
-- the lazy reminders' intent and inserts their state rows, and reads and
-- moves the watermark; the reconciler and the operator read it (gauges,
-- stats).
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
               FROM pg_attribute att, aclexplode(att.attacl) AS a
              WHERE att.attrelid = 'reminders'::regclass AND att.attname = 'key' AND a.privilege_type = 'INSERT'
             UNION
             SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
               FROM pg_class c, aclexplode(c.relacl) AS a
              WHERE c.oid = 'reminders'::regclass AND a.grantee <> c.relowner AND a.privilege_type = 'INSERT'
    LOOP
        EXECUTE format('GRANT INSERT (lazy) ON reminders TO %s', g.grantee);
        EXECUTE format('GRANT SELECT ON nudge_lazy_intake TO %s', g.grantee);
    END LOOP;
END $$;
GRANT SELECT (lazy) ON reminders TO nudge_dispatcher;
GRANT INSERT (id, tenant, channel, due_at, deadline, tz, window_open, window_close, window_days)
    ON reminder_state TO nudge_dispatcher;
GRANT SELECT, UPDATE ON nudge_promoter TO nudge_dispatcher;
GRANT SELECT ON nudge_lazy_intake TO nudge_dispatcher, nudge_reconciler, nudge_operator;
GRANT SELECT ON nudge_promoter TO nudge_reconciler, nudge_operator;
GRANT INSERT (promoted, final_until, prov_until) ON dispatch_runs TO nudge_dispatcher;
