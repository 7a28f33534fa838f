-- Nudge schema, version 20: renewal campaigns planned in checkpointed slices
-- (issue 15, first slice).
--
-- A campaign turns an audience (rows of a table or view in the application's
-- database) into reminders, a slice at a time: the planner (internal/campaign)
-- takes a signed planning command from the broker, locks the campaign row,
-- reads at most slice_size audience rows after the cursor (keyset on the
-- source's key column, never OFFSET), schedules them through the bulk intake
-- statement with the logical keys campaign:<id>:<audience key>, and stores the
-- next cursor, the counts and a campaign_slices checkpoint row in the SAME
-- transaction. A killed planner resumes from the last checkpoint; a replayed
-- command finds the fence moved on and writes nothing.
--
-- Naming a table is a privilege: a campaign may only name a source the owner
-- registered in campaign_sources for the campaign's tenant (nudge_campaign_source,
-- not granted to anyone), and the planner reads it with its own rights
-- (nudge_campaign_audience is SECURITY INVOKER), so the application grants
-- nudge_planner SELECT on exactly the view it wants planned. The web tier
-- never names a relation, only a registered source.
--
--   nudge_planner   (new) the planner: reads campaigns, sources and the
--                   granted audience views, writes slices, bad rows, the
--                   campaign's progress columns, and reminders through the
--                   bulk intake statement (pkg/intake ScheduleMany)
--   nudge_intake,   create, pause, resume and cancel campaigns of their
--   nudge_operator  tenants through the functions below; read them

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'nudge_planner') THEN
        BEGIN
            CREATE ROLE nudge_planner NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL; -- created by a concurrent migration in another database
        END;
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO nudge_planner', current_schema());
END $$;

-- Audience sources the owner allows campaigns to read, per tenant.
CREATE TABLE campaign_sources (
    name             text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_-]{0,62}$'),
    tenant           text NOT NULL CHECK (tenant <> ''),
    relation         regclass NOT NULL,
    -- A stable unique key: the keyset cursor and the audience key.
    key_column       name NOT NULL,
    recipient_column name NOT NULL,
    -- A json or jsonb object column used as the template's data (NULL: {}).
    data_column      name,
    -- A date or timestamptz column for the "N days before" due rule.
    date_column      name
);

-- Registers (or replaces) an audience source after checking that its columns
-- exist and that nudge_planner may read them. The owner runs it:
--   SELECT nudge_campaign_source('acme-renewals', 'acme', 'app.renewals_v',
--                                'learner_id', 'email', 'profile', 'expires_on');
CREATE FUNCTION nudge_campaign_source(p_name text, p_tenant text, p_relation regclass,
                                      p_key name, p_recipient name, p_data name, p_date name)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    col name;
BEGIN
    FOREACH col IN ARRAY array_remove(ARRAY[p_key, p_recipient, p_data, p_date], NULL) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                        WHERE attrelid = p_relation AND attname = col AND attnum > 0 AND NOT attisdropped) THEN
            RAISE EXCEPTION 'nudge: % has no column %', p_relation, quote_ident(col) USING ERRCODE = '42703';
        END IF;
        IF NOT has_column_privilege('nudge_planner', p_relation, col, 'SELECT') THEN
            RAISE EXCEPTION 'nudge: nudge_planner may not read %.%', p_relation, quote_ident(col)
                USING ERRCODE = '42501', HINT = format('GRANT SELECT ON %s TO nudge_planner', p_relation);
        END IF;
    END LOOP;
    INSERT INTO campaign_sources VALUES (p_name, p_tenant, p_relation, p_key, p_recipient, p_data, p_date)
        ON CONFLICT (name) DO UPDATE SET tenant = EXCLUDED.tenant, relation = EXCLUDED.relation,
            key_column = EXCLUDED.key_column, recipient_column = EXCLUDED.recipient_column,
            data_column = EXCLUDED.data_column, date_column = EXCLUDED.date_column;
END $$;
REVOKE ALL ON FUNCTION nudge_campaign_source(text, text, regclass, name, name, name, name) FROM PUBLIC;

CREATE TABLE campaigns (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant      text NOT NULL CHECK (tenant <> ''),
    name        text NOT NULL CHECK (name <> '' AND length(name) <= 200),
    channel     text NOT NULL CHECK (channel IN ('email', 'sms', 'webhook')),
    template    text NOT NULL CHECK (template <> ''),
    source      text NOT NULL REFERENCES campaign_sources (name),
    -- The due rule: a fixed instant, or days_before the source's date column.
    due_at      timestamptz,
    days_before integer CHECK (days_before BETWEEN 0 AND 3650),
    -- The business deadline: every reminder's deadline (at the latest), and
    -- the end of planning: a campaign still planning then ends 'late'.
    deadline    timestamptz NOT NULL,
    slice_size  integer NOT NULL CHECK (slice_size BETWEEN 1 AND 10000),
    -- How long one slice may hold the campaign: the planner's transaction
    -- timeouts, far below the platform's limit on a message's processing.
    lease       interval NOT NULL CHECK (lease > interval '0' AND lease <= interval '10 minutes'),
    state       text NOT NULL DEFAULT 'planning'
                CHECK (state IN ('planning', 'paused', 'done', 'canceled', 'late')),
    -- The last audience key planned (text of the key column); NULL: none yet.
    cursor      text,
    -- The fence: slices committed. A planning command names the fence it was
    -- published for, and plans only while the campaign still has it.
    fence       bigint NOT NULL DEFAULT 0,
    -- The highest fence a continuation was published (confirmed) for.
    continued   bigint NOT NULL DEFAULT 0,
    planned     bigint NOT NULL DEFAULT 0,
    bad         bigint NOT NULL DEFAULT 0,
    -- Audience rows left unplanned when the campaign ended late.
    unplanned   bigint,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz,
    CONSTRAINT campaigns_name UNIQUE (tenant, name),
    CONSTRAINT campaigns_one_due_rule CHECK ((due_at IS NULL) <> (days_before IS NULL)),
    CONSTRAINT campaigns_due_before_deadline CHECK (due_at IS NULL OR due_at < deadline)
);

-- The checkpoint log: one row per committed slice, written in the slice's
-- transaction. cursor_from of a slice is cursor_to of the one before.
CREATE TABLE campaign_slices (
    campaign_id bigint NOT NULL REFERENCES campaigns (id),
    slice       bigint NOT NULL,
    cursor_from text,
    cursor_to   text,
    rows_read   integer NOT NULL,
    intents     integer NOT NULL,
    bad_rows    integer NOT NULL,
    planner     text NOT NULL,
    at          timestamptz NOT NULL,
    PRIMARY KEY (campaign_id, slice)
);

-- Audience rows that could not become a reminder, with the reason.
CREATE TABLE campaign_bad_rows (
    campaign_id  bigint NOT NULL REFERENCES campaigns (id),
    audience_key text NOT NULL,
    reason       text NOT NULL,
    at           timestamptz NOT NULL,
    PRIMARY KEY (campaign_id, audience_key)
);

-- A campaign's source and the type of its key column (as format_type names it).
CREATE FUNCTION nudge_campaign_source_of(p_campaign bigint, OUT s campaign_sources, OUT keytype text)
LANGUAGE sql STABLE AS $$
    SELECT src, format_type(a.atttypid, a.atttypmod)
      FROM campaigns c
      JOIN campaign_sources src ON src.name = c.source
      JOIN pg_catalog.pg_attribute a ON a.attrelid = src.relation AND a.attname = src.key_column
                                    AND NOT a.attisdropped
     WHERE c.id = p_campaign;
$$;

-- Reads at most p_limit audience rows of a campaign after p_after (the
-- cursor, as text; NULL: from the start), in key order. Invoker's rights:
-- the planner reads only what it was granted. The key is compared in its own
-- type, so the source's index on it serves the keyset scan.
CREATE FUNCTION nudge_campaign_audience(p_campaign bigint, p_after text, p_limit integer)
RETURNS TABLE (a_key text, a_recipient text, a_data jsonb, a_date timestamptz)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    src record;
BEGIN
    SELECT * INTO STRICT src FROM nudge_campaign_source_of(p_campaign);
    RETURN QUERY EXECUTE format(
        -- ORDER BY names the source's column: bare, it would name the
        -- output column of the same name, the key as text, and sort 10 before 9.
        'SELECT src.%1$I::text, src.%2$I::text, %3$s, %4$s FROM %5$s AS src '
        'WHERE src.%1$I IS NOT NULL AND ($1::text IS NULL OR src.%1$I > $1::text::%6$s) ORDER BY src.%1$I LIMIT $2',
        (src.s).key_column, (src.s).recipient_column,
        CASE WHEN (src.s).data_column IS NULL THEN '''{}''::jsonb'
             ELSE format('to_jsonb(src.%I)', (src.s).data_column) END,
        CASE WHEN (src.s).date_column IS NULL THEN 'NULL::timestamptz'
             ELSE format('src.%I::timestamptz', (src.s).date_column) END,
        (src.s).relation, src.keytype)
        USING p_after, p_limit;
END $$;

-- Counts a campaign's audience rows after p_after: the unplanned remainder.
CREATE FUNCTION nudge_campaign_remaining(p_campaign bigint, p_after text)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    src record;
    n bigint;
BEGIN
    SELECT * INTO STRICT src FROM nudge_campaign_source_of(p_campaign);
    EXECUTE format('SELECT count(*) FROM %s WHERE %I IS NOT NULL AND ($1::text IS NULL OR %I > $1::text::%s)',
                   (src.s).relation, (src.s).key_column, (src.s).key_column, src.keytype)
        INTO n USING p_after;
    RETURN n;
END $$;

-- Creates a campaign, or returns the one of the same (tenant, name): creating
-- the same campaign twice returns the first (created false), whatever the
-- second asked. NULL slice size and lease take the defaults (200, 30 s).
CREATE FUNCTION nudge_campaign_create(p_tenant text, p_name text, p_channel text, p_template text,
                                      p_source text, p_due_at timestamptz, p_days_before integer,
                                      p_deadline timestamptz, p_slice_size integer, p_lease interval)
RETURNS TABLE (id bigint, created boolean)
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    RETURN QUERY SELECT c.id, false FROM campaigns c WHERE c.tenant = p_tenant AND c.name = p_name;
    IF FOUND THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM campaign_sources s WHERE s.name = p_source AND s.tenant = p_tenant) THEN
        RAISE EXCEPTION 'nudge: field "source" names no audience source of tenant %', quote_literal(p_tenant)
            USING ERRCODE = '22023', COLUMN = 'source';
    END IF;
    IF p_days_before IS NOT NULL AND NOT EXISTS (SELECT 1 FROM campaign_sources s
                                                  WHERE s.name = p_source AND s.date_column IS NOT NULL) THEN
        RAISE EXCEPTION 'nudge: field "days_before" needs a source with a date column'
            USING ERRCODE = '22023', COLUMN = 'days_before';
    END IF;
    RETURN QUERY
    INSERT INTO campaigns AS c (tenant, name, channel, template, source, due_at, days_before, deadline,
                                slice_size, lease)
    VALUES (p_tenant, p_name, p_channel, p_template, p_source, p_due_at, p_days_before, p_deadline,
            coalesce(p_slice_size, 200), coalesce(p_lease, interval '30 seconds'))
    ON CONFLICT ON CONSTRAINT campaigns_name DO NOTHING
    RETURNING c.id, true;
    IF NOT FOUND THEN -- a concurrent create of the same name committed first
        RETURN QUERY SELECT c.id, false FROM campaigns c WHERE c.tenant = p_tenant AND c.name = p_name;
    END IF;
END $$;

-- Pause, resume and cancel: the new state, or the current one when the
-- campaign is not in a state the action applies to (an answer, not an
-- error). Another tenant's campaign, or none, raises insufficient_privilege
-- or no_data_found.
CREATE FUNCTION nudge_campaign_set(p_tenant text, p_id bigint, p_action text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    st text;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    UPDATE campaigns c
       SET state = CASE p_action WHEN 'pause' THEN 'paused' WHEN 'resume' THEN 'planning' ELSE 'canceled' END,
           updated_at = now(),
           ended_at = CASE WHEN p_action = 'cancel' THEN now() END
     WHERE c.id = p_id AND c.tenant = p_tenant
       AND c.state = ANY (CASE p_action WHEN 'pause' THEN ARRAY['planning']
                                        WHEN 'resume' THEN ARRAY['paused']
                                        WHEN 'cancel' THEN ARRAY['planning', 'paused'] END)
    RETURNING c.state INTO st;
    IF st IS NULL THEN
        SELECT c.state INTO st FROM campaigns c WHERE c.id = p_id AND c.tenant = p_tenant;
    END IF;
    IF st IS NULL THEN
        RAISE EXCEPTION 'nudge: tenant % has no campaign %', quote_literal(p_tenant), p_id USING ERRCODE = 'P0002';
    END IF;
    RETURN st;
END $$;

-- Pinned to this schema, as every SECURITY DEFINER function of version 2.
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'nudge_campaign_create(text, text, text, text, text, timestamptz, integer, timestamptz, integer, interval)',
        'nudge_campaign_set(text, bigint, text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END $$;

REVOKE ALL ON FUNCTION nudge_campaign_create(text, text, text, text, text, timestamptz, integer, timestamptz, integer, interval),
                       nudge_campaign_set(text, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION nudge_campaign_create(text, text, text, text, text, timestamptz, integer, timestamptz, integer, interval),
                          nudge_campaign_set(text, bigint, text)
    TO nudge_intake, nudge_operator;

-- Intake sees its tenants' campaigns only; the components see them all.
ALTER TABLE campaigns ENABLE ROW LEVEL SECURITY;
CREATE POLICY nudge_components ON campaigns TO nudge_planner, nudge_operator USING (true) WITH CHECK (true);
CREATE POLICY nudge_intake_own ON campaigns FOR SELECT TO nudge_intake USING (nudge_tenant_allowed(tenant));
GRANT SELECT ON campaigns TO nudge_intake, nudge_operator, nudge_planner;
GRANT SELECT ON campaign_slices, campaign_bad_rows TO nudge_operator, nudge_planner;
GRANT SELECT ON campaign_sources TO nudge_operator, nudge_planner;

-- The planner: its statements (internal/campaign/queries.sql) and the bulk
-- intake statement, as nudge_operator has them (version 2).
GRANT UPDATE (state, cursor, fence, continued, planned, bad, unplanned, updated_at, ended_at)
    ON campaigns TO nudge_planner;
GRANT INSERT ON campaign_slices, campaign_bad_rows TO nudge_planner;
CREATE POLICY nudge_planner ON reminders TO nudge_planner USING (true) WITH CHECK (true);
CREATE POLICY nudge_planner ON reminder_events TO nudge_planner USING (true) WITH CHECK (true);
-- The bulk statement reads the existing row of a key whole (to answer
-- "exists" or "conflict"), as it does for nudge_operator.
GRANT SELECT ON reminders TO nudge_planner;
-- The planner inserts what the bulk intake statement inserts, which is what
-- nudge_operator may insert (nudgectl schedule runs the same statement):
-- the columns are copied from its grants, so they follow the columns earlier
-- migrations gave intake (send windows among them). A later migration that
-- makes the statement insert another column grants it to both roles.
DO $$
DECLARE
    cols text;
BEGIN
    SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO STRICT cols
      FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = 'reminders'::regclass AND a.attnum > 0 AND NOT a.attisdropped
       AND has_column_privilege('nudge_operator', 'reminders'::regclass, a.attnum, 'INSERT');
    EXECUTE format('GRANT INSERT (%s) ON reminders TO nudge_planner', cols);
END $$;
GRANT INSERT (reminder_id, from_state, to_state, fence, actor, code, reason, at)
    ON reminder_events TO nudge_planner;
-- The pure local-time functions intake's validation calls, and the zone
-- table they read, as version 11 grants them to every component role.
GRANT SELECT ON nudge_time_zones TO nudge_planner;
GRANT EXECUTE ON FUNCTION
    nudge_tz_name_allowed(text),
    nudge_valid_tz(text),
    nudge_resolve_local(timestamp, text),
    nudge_window_check(time, time, integer),
    nudge_window_opening(date, time, time, integer, text),
    nudge_window_open(time, time, integer, text, timestamptz),
    nudge_next_opening(time, time, integer, text, timestamptz)
  TO nudge_planner;
