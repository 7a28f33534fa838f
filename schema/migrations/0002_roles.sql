-- Nudge schema, version 2: least privilege. One NOLOGIN group role per
-- component, each granted only what its statements use (internal/store/queries.sql
-- for the fleet, pkg/intake and nudgectl for the rest); login roles are made
-- members of them (docs/deploy.md). Superusers and the owner of these tables
-- (the login that runs `nudgectl migrate`) keep every right and bypass
-- row-level security, so nothing changes for them.
--
--   nudge_intake      the web tier: schedules and cancels through the
--                     functions below, for the tenants its login is granted in
--                     nudge_intake_tenants, and reads those tenants' rows
--                     (row-level security); no direct writes at all
--   nudge_dispatcher  ClaimDue, MarkEnqueued, Release
--   nudge_worker      LoadForDelivery, ClaimAttempts, ExpireFenced, Quarantine,
--                     RecordOutcomes
--   nudge_reconciler  ExpireOverdue, ReleaseExpiredLeases, Reclaim,
--                     MarkEnqueued, Release
--   nudge_operator    nudgectl schedule, cancel, show and stats (not migrate:
--                     that needs the owner)
--
-- Privileges are column by column: the dispatcher and the reconciler cannot
-- read recipients, templates or data; nobody but the owner can DELETE,
-- TRUNCATE, or change a reminder's tenant, key, recipient or content. A new
-- statement that touches another column needs its grant here (or in a later
-- migration); schema/roles_test.go runs every statement as its role and
-- fails naming the missing privilege.
--
-- Roles are cluster-wide while this migration runs once per schema, and
-- installs in other databases of the cluster may run it at the same moment
-- (the advisory lock is per database): creation tolerates a role that exists
-- or is being created, and existing roles are never altered. A migrating
-- login without CREATEROLE works when the roles were created beforehand.
-- Grants name the schema the migration runs in (current_schema()), so
-- several installs can share a cluster.

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['nudge_intake', 'nudge_dispatcher', 'nudge_worker',
                             'nudge_reconciler', 'nudge_operator'] LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r);
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL; -- created by a concurrent migration in another database
        END;
    END LOOP;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO nudge_intake, nudge_dispatcher, nudge_worker, '
                   'nudge_reconciler, nudge_operator', current_schema());
END $$;

-- ---------------------------------------------------------------------------
-- Tenants per intake login.

-- Which tenants a login (or any role it is a member of) may schedule, cancel
-- and read as nudge_intake; '*' means every tenant. Managed by the owner:
--   INSERT INTO nudge_intake_tenants VALUES ('web_acme', 'acme');
-- Within what its login is granted, a session narrows itself to one tenant
-- with SET nudge.tenant = 'acme' (or set_config('nudge.tenant', 'acme', true)
-- per transaction): a web tier serving many tenants under one '*' login
-- scopes each request that way.
CREATE TABLE nudge_intake_tenants (
    grantee name NOT NULL,
    tenant  text NOT NULL CHECK (tenant <> ''),
    PRIMARY KEY (grantee, tenant)
);

-- Whether the session may act for p_tenant: p_tenant is the session tenant
-- (nudge.tenant) when one is set, and the login may insert reminders directly
-- anyway (owner, superuser, nudge_operator) or is granted the tenant in
-- nudge_intake_tenants. The login is session_user: inside the SECURITY
-- DEFINER functions below current_user is their owner.
CREATE FUNCTION nudge_tenant_allowed(p_tenant text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER AS $$
    SELECT p_tenant IS NOT NULL
       AND p_tenant = coalesce(nullif(current_setting('nudge.tenant', true), ''), p_tenant)
       AND (has_any_column_privilege(session_user, 'reminders', 'INSERT')
            OR EXISTS (SELECT 1
                         FROM nudge_intake_tenants g
                         JOIN pg_catalog.pg_roles r ON r.rolname = g.grantee
                        WHERE g.tenant IN (p_tenant, '*')
                          AND pg_has_role(session_user, r.oid, 'MEMBER')))
$$;

-- Raises insufficient_privilege (42501) unless nudge_tenant_allowed(p_tenant).
CREATE FUNCTION nudge_check_tenant(p_tenant text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT nudge_tenant_allowed(p_tenant) THEN
        RAISE EXCEPTION 'nudge: role % may not act for tenant %', session_user, quote_literal(p_tenant)
            USING ERRCODE = '42501',
                  DETAIL = format('session tenant (nudge.tenant): %s',
                                  coalesce(nullif(current_setting('nudge.tenant', true), ''), 'not set')),
                  HINT = 'grant the tenant to the login in nudge_intake_tenants, and set nudge.tenant to it or leave it unset';
    END IF;
END $$;

-- ---------------------------------------------------------------------------
-- Intake functions: the version-1 bodies are kept under *_unchecked names
-- (invoker's rights: callable only by roles that may write the tables anyway)
-- and the public names become SECURITY DEFINER wrappers that check the tenant
-- first. nudge_schedule keeps calling nudge_try_schedule by name, so it goes
-- through the check too. A later migration replacing nudge_try_schedule or
-- nudge_cancel must keep SECURITY DEFINER, the check and the search_path.

ALTER FUNCTION nudge_try_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text)
    RENAME TO nudge_try_schedule_unchecked;
ALTER FUNCTION nudge_cancel(text, text, text, text) RENAME TO nudge_cancel_unchecked;

-- nudge_try_schedule as in version 1, for a tenant the session may act for
-- (else it raises 42501; an empty tenant is still reported as 'invalid').
CREATE FUNCTION nudge_try_schedule(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz,
    p_actor text DEFAULT 'intake',
    OUT id bigint, OUT status text, OUT field text, OUT reason text)
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    IF nullif(btrim(p_tenant), '') IS NOT NULL THEN
        PERFORM nudge_check_tenant(p_tenant);
    END IF;
    SELECT u.id, u.status, u.field, u.reason INTO id, status, field, reason
      FROM nudge_try_schedule_unchecked(p_tenant, p_key, p_channel, p_recipient, p_template,
                                        p_data, p_due_at, p_deadline, p_actor) u;
END $$;

-- nudge_cancel as in version 1, for a tenant the session may act for (else
-- it raises 42501, whether or not the key exists).
CREATE FUNCTION nudge_cancel(p_tenant text, p_key text, p_actor text DEFAULT 'intake',
                             p_reason text DEFAULT 'canceled by application')
RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    RETURN nudge_cancel_unchecked(p_tenant, p_key, p_actor, p_reason);
END $$;

-- A SECURITY DEFINER function must not resolve names through the caller's
-- search_path: pin every one to this schema (pg_temp last, so a caller's
-- temporary objects cannot shadow ours). nudge_schedule too, so that a caller
-- whose search_path lacks the schema can call it schema-qualified.
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'nudge_tenant_allowed(text)',
        'nudge_try_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text)',
        'nudge_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz)',
        'nudge_cancel(text, text, text, text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END $$;

REVOKE EXECUTE ON FUNCTION
    nudge_tenant_allowed(text),
    nudge_check_tenant(text),
    nudge_try_schedule_unchecked(text, text, text, text, text, jsonb, timestamptz, timestamptz, text),
    nudge_cancel_unchecked(text, text, text, text),
    nudge_try_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text),
    nudge_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz),
    nudge_cancel(text, text, text, text)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    nudge_tenant_allowed(text),
    nudge_try_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz, text),
    nudge_schedule(text, text, text, text, text, jsonb, timestamptz, timestamptz),
    nudge_cancel(text, text, text, text)
  TO nudge_intake, nudge_operator;

-- ---------------------------------------------------------------------------
-- Row-level security: intake sees its tenants' rows only. RLS shows a role
-- with no policy nothing at all, so every component role has one that shows
-- everything. (Owners and superusers bypass RLS.)

ALTER TABLE reminders ENABLE ROW LEVEL SECURITY;
ALTER TABLE reminder_events ENABLE ROW LEVEL SECURITY;

CREATE POLICY nudge_components ON reminders
    TO nudge_dispatcher, nudge_worker, nudge_reconciler, nudge_operator
    USING (true) WITH CHECK (true);
CREATE POLICY nudge_intake_own ON reminders FOR SELECT TO nudge_intake
    USING (nudge_tenant_allowed(tenant));

CREATE POLICY nudge_components ON reminder_events
    TO nudge_dispatcher, nudge_worker, nudge_reconciler, nudge_operator
    USING (true) WITH CHECK (true);
-- The events of reminders intake can see (the subquery is itself subject to
-- the reminders policy above).
CREATE POLICY nudge_intake_own ON reminder_events FOR SELECT TO nudge_intake
    USING (EXISTS (SELECT 1 FROM reminders r WHERE r.id = reminder_id));

-- ---------------------------------------------------------------------------
-- Table privileges, column by column, from the statements each role runs.

-- Intake: reads (filtered by the policies); writes only through the functions.
GRANT SELECT ON reminders, reminder_events TO nudge_intake;

-- Dispatcher: ClaimDue, MarkEnqueued, Release.
GRANT SELECT (id, tenant, channel, idempotency_key, due_at, deadline, state, fence, attempts, reason)
    ON reminders TO nudge_dispatcher;
GRANT UPDATE (state, fence, lease_until, reason, last_error, enqueued_at, finished_at, updated_at)
    ON reminders TO nudge_dispatcher;
GRANT INSERT (reminder_id, from_state, to_state, fence, actor, reason, at)
    ON reminder_events TO nudge_dispatcher;

-- Worker: LoadForDelivery, ClaimAttempts, ExpireFenced, Quarantine, RecordOutcomes.
GRANT SELECT (id, tenant, channel, recipient, template, data, due_at, deadline, idempotency_key,
              state, fence, attempts, last_error)
    ON reminders TO nudge_worker;
GRANT UPDATE (state, fence, attempts, lease_until, next_attempt_at, last_error, reason,
              finished_at, updated_at)
    ON reminders TO nudge_worker;
GRANT INSERT (reminder_id, from_state, to_state, fence, actor, reason, at)
    ON reminder_events TO nudge_worker;
GRANT SELECT (id, reminder_id) ON delivery_attempts TO nudge_worker;
GRANT INSERT (reminder_id, attempt, fence, worker, started_at) ON delivery_attempts TO nudge_worker;
GRANT UPDATE (finished_at, outcome, provider_message_id, error) ON delivery_attempts TO nudge_worker;

-- Reconciler: ExpireOverdue, ReleaseExpiredLeases, Reclaim, MarkEnqueued, Release.
GRANT SELECT (id, tenant, channel, idempotency_key, deadline, state, fence, attempts, republishes,
              lease_until, enqueued_at, next_attempt_at, reason)
    ON reminders TO nudge_reconciler;
GRANT UPDATE (state, fence, republishes, lease_until, reason, last_error, enqueued_at,
              finished_at, updated_at)
    ON reminders TO nudge_reconciler;
GRANT INSERT (reminder_id, from_state, to_state, fence, actor, reason, at)
    ON reminder_events TO nudge_reconciler;

-- Operator (nudgectl): schedule (pkg/intake's set-based statement), cancel
-- (nudge_cancel), show and stats; reads the attempts and the tenant grants.
GRANT SELECT ON reminders, reminder_events, delivery_attempts, nudge_intake_tenants, nudge_migrations
    TO nudge_operator;
GRANT INSERT (tenant, key, channel, recipient, template, data, due_at, deadline, idempotency_key)
    ON reminders TO nudge_operator;
GRANT INSERT (reminder_id, from_state, to_state, fence, actor, reason, at)
    ON reminder_events TO nudge_operator;
