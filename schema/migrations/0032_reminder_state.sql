-- The narrow hot-state table (issue 18, "The narrow hot-state layout" in
-- docs/benchmarks.md): the columns the delivery path rewrites (state, fence,
-- leases, the happy path's slots and times) move out of the wide reminders
-- row into reminder_state, one row per reminder, with every index whose
-- predicate names state. A transition then rewrites a ~110-byte tuple and
-- enters no (tenant, key) index entry: measured 19–20 WAL records and
-- 1.7–1.8 KB per delivered reminder against 22–24 and 2.2–2.9 KB.
--
-- This is the expand step of a rolling change. The previous release's
-- binaries keep reading and writing the hot columns of reminders; this
-- release's read and write reminder_state. Until the after-rollout step
-- (migration 35) drops them, triggers keep the two copies equal in both directions inside the
-- writing transaction, so either release sees and makes the same state:
--   reminders       -> reminder_state  on INSERT and UPDATE (forward)
--   reminder_state  -> reminders       on UPDATE (reverse)
-- A mirror's own write is not mirrored back (pg_trigger_depth() > 1), and
-- an update copies only the state columns it changed, of the rows where it
-- changed one: a statement that writes the payload of reminders and the
-- state of reminder_state together keeps both, and one that writes only
-- the payload rewrites no state row. Each trigger is
-- a statement trigger over its transition table: one statement per batch,
-- not one per row.
--
-- Locks: a writer of reminders locks that row and then, at its statement's
-- end, the state row; a writer of reminder_state the reverse. An old and a
-- new claimer racing for the same row can therefore deadlock; PostgreSQL
-- detects it and aborts one, whose batch is retried. So the claimers
-- (dispatchers, workers, reconcilers) roll as a group: docs/deploy.md.
--
-- Rows that exist before this migration are copied by the backfill that
-- schema.Migrate runs before migration 0033 (in batches, each its own
-- transaction, so the old fleet's writes wait at most for one batch); the
-- forward trigger covers every row inserted or changed from here on.

CREATE TABLE reminder_state (
    id               bigint PRIMARY KEY REFERENCES reminders (id) ON DELETE CASCADE,
    tenant           text NOT NULL,
    channel          text NOT NULL CHECK (channel IN ('email', 'sms', 'webhook')),
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'leased', 'enqueued', 'sending', 'retrying', 'quarantined',
                                      'delivered', 'failed', 'expired', 'canceled')),
    fence            bigint NOT NULL DEFAULT 0,
    due_at           timestamptz NOT NULL,
    deadline         timestamptz NOT NULL,
    lease_until      timestamptz,
    attempts         integer NOT NULL DEFAULT 0,
    republishes      integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    enqueued_at      timestamptz,
    dispatch_batch   bigint,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    purged_at        timestamptz,
    requested_due_at timestamptz,
    claimed_at       timestamptz,
    claimed_fence    bigint,
    claimed_by       text,
    started_at       timestamptz,
    started_fence    bigint,
    started_by       text,
    delivered_by     text,
    reason           text,
    last_error       text,
    tz               text,
    window_open      time,
    window_close     time,
    window_days      integer,
    CONSTRAINT reminder_state_deadline_after_due CHECK (deadline > due_at)
);

-- Every index of reminders whose predicate names state, on the state row.
-- The ones on reminders stay until the after-rollout step (35): the
-- previous release's statements plan with them.
CREATE INDEX reminder_state_enqueued ON reminder_state (enqueued_at) WHERE state = 'enqueued';
CREATE INDEX reminder_state_expired ON reminder_state (finished_at) WHERE state = 'expired';
CREATE INDEX reminder_state_leases ON reminder_state (lease_until)
    WHERE state IN ('leased', 'enqueued', 'sending') AND lease_until IS NOT NULL;
CREATE INDEX reminder_state_parked ON reminder_state (channel, state)
    WHERE state IN ('leased', 'retrying', 'quarantined');
CREATE INDEX reminder_state_pending_due ON reminder_state (due_at, id) WHERE state = 'pending';
CREATE INDEX reminder_state_pending_tenant ON reminder_state (tenant, due_at, id) WHERE state = 'pending';
CREATE INDEX reminder_state_replayable ON reminder_state (due_at) WHERE state IN ('failed', 'quarantined');
CREATE INDEX reminder_state_retrying ON reminder_state (next_attempt_at) WHERE state = 'retrying';
CREATE INDEX reminder_state_terminal ON reminder_state (coalesce(finished_at, updated_at))
    WHERE state IN ('delivered', 'failed', 'expired', 'canceled');
CREATE INDEX reminder_state_terminal_unpurged ON reminder_state (coalesce(finished_at, updated_at))
    WHERE purged_at IS NULL AND state IN ('delivered', 'failed', 'expired', 'canceled');
CREATE INDEX reminder_state_unsent_deadline ON reminder_state (deadline)
    WHERE state IN ('pending', 'leased', 'enqueued', 'retrying', 'quarantined');

-- Row security and privileges as on reminders: each policy copied with its
-- roles, command and expressions, each table and column privilege granted
-- to the same role (column privileges for the columns both tables have).
ALTER TABLE reminder_state ENABLE ROW LEVEL SECURITY;
DO $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT policyname, permissive, roles, cmd, qual, with_check
               FROM pg_policies
              WHERE schemaname = current_schema() AND tablename = 'reminders'
    LOOP
        EXECUTE format('CREATE POLICY %I ON reminder_state AS %s FOR %s TO %s%s%s',
                       p.policyname, p.permissive, p.cmd,
                       (SELECT string_agg(quote_ident(r), ', ') FROM unnest(p.roles) AS r),
                       CASE WHEN p.qual IS NULL THEN '' ELSE ' USING (' || p.qual || ')' END,
                       CASE WHEN p.with_check IS NULL THEN '' ELSE ' WITH CHECK (' || p.with_check || ')' END);
    END LOOP;
END $$;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT a.privilege_type,
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
               FROM pg_class c, aclexplode(c.relacl) AS a
              WHERE c.oid = 'reminders'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON reminder_state TO %s', g.privilege_type, g.grantee);
    END LOOP;
    FOR g IN SELECT a.privilege_type,
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee,
                    string_agg(quote_ident(att.attname), ', ' ORDER BY att.attnum) AS cols
               FROM pg_attribute att, aclexplode(att.attacl) AS a
              WHERE att.attrelid = 'reminders'::regclass AND att.attnum > 0 AND NOT att.attisdropped
                AND att.attname IN (SELECT s.attname FROM pg_attribute s
                                     WHERE s.attrelid = 'reminder_state'::regclass AND s.attnum > 0)
              GROUP BY 1, 2
    LOOP
        EXECUTE format('GRANT %s (%s) ON reminder_state TO %s', g.privilege_type, g.cols, g.grantee);
    END LOOP;
    -- reminders.id is an identity column, so no role inserts it there; a
    -- role that inserts reminders inserts their state rows with that id.
    FOR g IN SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END AS grantee
               FROM pg_attribute att, aclexplode(att.attacl) AS a
              WHERE att.attrelid = 'reminders'::regclass AND att.attnum > 0 AND a.privilege_type = 'INSERT'
    LOOP
        EXECUTE format('GRANT INSERT (id) ON reminder_state TO %s', g.grantee);
    END LOOP;
END $$;

-- The mirror. Column lists are spelled out in full in each function, in
-- the table's order, so a reader can check them against each other.
CREATE FUNCTION nudge_state_mirror_inserted() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    INSERT INTO reminder_state (id, tenant, channel, state, fence, due_at, deadline, lease_until, attempts,
                                republishes, next_attempt_at, enqueued_at, dispatch_batch, updated_at, finished_at,
                                purged_at, requested_due_at, claimed_at, claimed_fence, claimed_by, started_at,
                                started_fence, started_by, delivered_by, reason, last_error, tz, window_open,
                                window_close, window_days)
    SELECT id, tenant, channel, state, fence, due_at, deadline, lease_until, attempts,
           republishes, next_attempt_at, enqueued_at, dispatch_batch, updated_at, finished_at,
           purged_at, requested_due_at, claimed_at, claimed_fence, claimed_by, started_at,
           started_fence, started_by, delivered_by, reason, last_error, tz, window_open,
           window_close, window_days
      FROM inserted ORDER BY id
    ON CONFLICT (id) DO NOTHING;
    RETURN NULL;
END $$;

CREATE FUNCTION nudge_state_mirror_updated() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    UPDATE reminder_state s
       SET state = CASE WHEN o.state IS DISTINCT FROM n.state THEN n.state ELSE s.state END,
           fence = CASE WHEN o.fence IS DISTINCT FROM n.fence THEN n.fence ELSE s.fence END,
           due_at = CASE WHEN o.due_at IS DISTINCT FROM n.due_at THEN n.due_at ELSE s.due_at END,
           deadline = CASE WHEN o.deadline IS DISTINCT FROM n.deadline THEN n.deadline ELSE s.deadline END,
           lease_until = CASE WHEN o.lease_until IS DISTINCT FROM n.lease_until THEN n.lease_until ELSE s.lease_until END,
           attempts = CASE WHEN o.attempts IS DISTINCT FROM n.attempts THEN n.attempts ELSE s.attempts END,
           republishes = CASE WHEN o.republishes IS DISTINCT FROM n.republishes THEN n.republishes ELSE s.republishes END,
           next_attempt_at = CASE WHEN o.next_attempt_at IS DISTINCT FROM n.next_attempt_at THEN n.next_attempt_at ELSE s.next_attempt_at END,
           enqueued_at = CASE WHEN o.enqueued_at IS DISTINCT FROM n.enqueued_at THEN n.enqueued_at ELSE s.enqueued_at END,
           dispatch_batch = CASE WHEN o.dispatch_batch IS DISTINCT FROM n.dispatch_batch THEN n.dispatch_batch ELSE s.dispatch_batch END,
           updated_at = CASE WHEN o.updated_at IS DISTINCT FROM n.updated_at THEN n.updated_at ELSE s.updated_at END,
           finished_at = CASE WHEN o.finished_at IS DISTINCT FROM n.finished_at THEN n.finished_at ELSE s.finished_at END,
           purged_at = CASE WHEN o.purged_at IS DISTINCT FROM n.purged_at THEN n.purged_at ELSE s.purged_at END,
           requested_due_at = CASE WHEN o.requested_due_at IS DISTINCT FROM n.requested_due_at THEN n.requested_due_at ELSE s.requested_due_at END,
           claimed_at = CASE WHEN o.claimed_at IS DISTINCT FROM n.claimed_at THEN n.claimed_at ELSE s.claimed_at END,
           claimed_fence = CASE WHEN o.claimed_fence IS DISTINCT FROM n.claimed_fence THEN n.claimed_fence ELSE s.claimed_fence END,
           claimed_by = CASE WHEN o.claimed_by IS DISTINCT FROM n.claimed_by THEN n.claimed_by ELSE s.claimed_by END,
           started_at = CASE WHEN o.started_at IS DISTINCT FROM n.started_at THEN n.started_at ELSE s.started_at END,
           started_fence = CASE WHEN o.started_fence IS DISTINCT FROM n.started_fence THEN n.started_fence ELSE s.started_fence END,
           started_by = CASE WHEN o.started_by IS DISTINCT FROM n.started_by THEN n.started_by ELSE s.started_by END,
           delivered_by = CASE WHEN o.delivered_by IS DISTINCT FROM n.delivered_by THEN n.delivered_by ELSE s.delivered_by END,
           reason = CASE WHEN o.reason IS DISTINCT FROM n.reason THEN n.reason ELSE s.reason END,
           last_error = CASE WHEN o.last_error IS DISTINCT FROM n.last_error THEN n.last_error ELSE s.last_error END,
           tz = CASE WHEN o.tz IS DISTINCT FROM n.tz THEN n.tz ELSE s.tz END,
           window_open = CASE WHEN o.window_open IS DISTINCT FROM n.window_open THEN n.window_open ELSE s.window_open END,
           window_close = CASE WHEN o.window_close IS DISTINCT FROM n.window_close THEN n.window_close ELSE s.window_close END,
           window_days = CASE WHEN o.window_days IS DISTINCT FROM n.window_days THEN n.window_days ELSE s.window_days END
      FROM changed n JOIN previous o ON o.id = n.id
     WHERE s.id = n.id
       AND (o.state, o.fence, o.due_at, o.deadline, o.lease_until, o.attempts, o.republishes,
            o.next_attempt_at, o.enqueued_at, o.dispatch_batch, o.updated_at, o.finished_at, o.purged_at,
            o.requested_due_at, o.claimed_at, o.claimed_fence, o.claimed_by, o.started_at, o.started_fence,
            o.started_by, o.delivered_by, o.reason, o.last_error, o.tz, o.window_open, o.window_close,
            o.window_days)
           IS DISTINCT FROM
           (n.state, n.fence, n.due_at, n.deadline, n.lease_until, n.attempts, n.republishes,
            n.next_attempt_at, n.enqueued_at, n.dispatch_batch, n.updated_at, n.finished_at, n.purged_at,
            n.requested_due_at, n.claimed_at, n.claimed_fence, n.claimed_by, n.started_at, n.started_fence,
            n.started_by, n.delivered_by, n.reason, n.last_error, n.tz, n.window_open, n.window_close,
            n.window_days);
    RETURN NULL;
END $$;

CREATE FUNCTION nudge_state_mirror_back() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    UPDATE reminders r
       SET state = CASE WHEN o.state IS DISTINCT FROM n.state THEN n.state ELSE r.state END,
           fence = CASE WHEN o.fence IS DISTINCT FROM n.fence THEN n.fence ELSE r.fence END,
           due_at = CASE WHEN o.due_at IS DISTINCT FROM n.due_at THEN n.due_at ELSE r.due_at END,
           deadline = CASE WHEN o.deadline IS DISTINCT FROM n.deadline THEN n.deadline ELSE r.deadline END,
           lease_until = CASE WHEN o.lease_until IS DISTINCT FROM n.lease_until THEN n.lease_until ELSE r.lease_until END,
           attempts = CASE WHEN o.attempts IS DISTINCT FROM n.attempts THEN n.attempts ELSE r.attempts END,
           republishes = CASE WHEN o.republishes IS DISTINCT FROM n.republishes THEN n.republishes ELSE r.republishes END,
           next_attempt_at = CASE WHEN o.next_attempt_at IS DISTINCT FROM n.next_attempt_at THEN n.next_attempt_at ELSE r.next_attempt_at END,
           enqueued_at = CASE WHEN o.enqueued_at IS DISTINCT FROM n.enqueued_at THEN n.enqueued_at ELSE r.enqueued_at END,
           dispatch_batch = CASE WHEN o.dispatch_batch IS DISTINCT FROM n.dispatch_batch THEN n.dispatch_batch ELSE r.dispatch_batch END,
           updated_at = CASE WHEN o.updated_at IS DISTINCT FROM n.updated_at THEN n.updated_at ELSE r.updated_at END,
           finished_at = CASE WHEN o.finished_at IS DISTINCT FROM n.finished_at THEN n.finished_at ELSE r.finished_at END,
           purged_at = CASE WHEN o.purged_at IS DISTINCT FROM n.purged_at THEN n.purged_at ELSE r.purged_at END,
           requested_due_at = CASE WHEN o.requested_due_at IS DISTINCT FROM n.requested_due_at THEN n.requested_due_at ELSE r.requested_due_at END,
           claimed_at = CASE WHEN o.claimed_at IS DISTINCT FROM n.claimed_at THEN n.claimed_at ELSE r.claimed_at END,
           claimed_fence = CASE WHEN o.claimed_fence IS DISTINCT FROM n.claimed_fence THEN n.claimed_fence ELSE r.claimed_fence END,
           claimed_by = CASE WHEN o.claimed_by IS DISTINCT FROM n.claimed_by THEN n.claimed_by ELSE r.claimed_by END,
           started_at = CASE WHEN o.started_at IS DISTINCT FROM n.started_at THEN n.started_at ELSE r.started_at END,
           started_fence = CASE WHEN o.started_fence IS DISTINCT FROM n.started_fence THEN n.started_fence ELSE r.started_fence END,
           started_by = CASE WHEN o.started_by IS DISTINCT FROM n.started_by THEN n.started_by ELSE r.started_by END,
           delivered_by = CASE WHEN o.delivered_by IS DISTINCT FROM n.delivered_by THEN n.delivered_by ELSE r.delivered_by END,
           reason = CASE WHEN o.reason IS DISTINCT FROM n.reason THEN n.reason ELSE r.reason END,
           last_error = CASE WHEN o.last_error IS DISTINCT FROM n.last_error THEN n.last_error ELSE r.last_error END,
           tz = CASE WHEN o.tz IS DISTINCT FROM n.tz THEN n.tz ELSE r.tz END,
           window_open = CASE WHEN o.window_open IS DISTINCT FROM n.window_open THEN n.window_open ELSE r.window_open END,
           window_close = CASE WHEN o.window_close IS DISTINCT FROM n.window_close THEN n.window_close ELSE r.window_close END,
           window_days = CASE WHEN o.window_days IS DISTINCT FROM n.window_days THEN n.window_days ELSE r.window_days END
      FROM changed n JOIN previous o ON o.id = n.id
     WHERE r.id = n.id
       AND (o.state, o.fence, o.due_at, o.deadline, o.lease_until, o.attempts, o.republishes,
            o.next_attempt_at, o.enqueued_at, o.dispatch_batch, o.updated_at, o.finished_at, o.purged_at,
            o.requested_due_at, o.claimed_at, o.claimed_fence, o.claimed_by, o.started_at, o.started_fence,
            o.started_by, o.delivered_by, o.reason, o.last_error, o.tz, o.window_open, o.window_close,
            o.window_days)
           IS DISTINCT FROM
           (n.state, n.fence, n.due_at, n.deadline, n.lease_until, n.attempts, n.republishes,
            n.next_attempt_at, n.enqueued_at, n.dispatch_batch, n.updated_at, n.finished_at, n.purged_at,
            n.requested_due_at, n.claimed_at, n.claimed_fence, n.claimed_by, n.started_at, n.started_fence,
            n.started_by, n.delivered_by, n.reason, n.last_error, n.tz, n.window_open, n.window_close,
            n.window_days);
    RETURN NULL;
END $$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION nudge_state_mirror_inserted() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION nudge_state_mirror_updated() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION nudge_state_mirror_back() SET search_path = %I, pg_temp', current_schema());
END $$;
REVOKE ALL ON FUNCTION nudge_state_mirror_inserted(), nudge_state_mirror_updated(), nudge_state_mirror_back()
    FROM PUBLIC;

CREATE TRIGGER reminders_state_mirror_inserted AFTER INSERT ON reminders
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION nudge_state_mirror_inserted();
CREATE TRIGGER reminders_state_mirror_updated AFTER UPDATE ON reminders
    REFERENCING OLD TABLE AS previous NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION nudge_state_mirror_updated();
CREATE TRIGGER reminder_state_mirror_back AFTER UPDATE ON reminder_state
    REFERENCING OLD TABLE AS previous NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION nudge_state_mirror_back();
