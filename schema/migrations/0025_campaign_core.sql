-- Nudge schema, version 25: the semantics of campaigns (issue 15, second
-- slice): recipient-local due rules, audiences staged from a file, the
-- admission record, shadow runs, the tenant cohort, a configured slice size.
--
-- Local time. A source may name a zone column (an IANA name per audience
-- row); a row whose zone is NULL or empty takes the campaign's default zone
-- (default_zone, UTC unless given). Two more due rules, exactly one rule per
-- campaign:
--   due_local               one wall-clock time, read in each recipient's zone
--                           ("2027-01-24 09:00 wherever they are")
--   days_before + at_local  N days before the recipient's own date, at a
--                           local time of day ("7 days before, 09:00 local")
-- The planner hands the wall time and the zone to intake (due_local, tz), so
-- every local time is resolved by nudge_resolve_local with the rules of
-- pkg/localtime (a skipped time moves forward by the gap; a repeated one is
-- the earlier instant).
--
-- Staged sources. `nudgectl campaign stage` loads a CSV or JSON Lines file
-- into campaign_staged_rows under a source name; the source is registered in
-- campaign_sources (staged = true, relation campaign_staged_rows) and read
-- with the same keyset cursor, restricted to its own rows. The lines that
-- could not be staged are in campaign_stage_errors (line, key, field,
-- reason); campaign_stages remembers the file's digest, so staging the same
-- file again changes nothing.

ALTER TABLE campaign_sources
    -- A text column of IANA zone names; NULL: every row takes the campaign's default zone.
    ADD COLUMN zone_column name,
    -- Rows staged from a file (campaign_staged_rows WHERE source = name).
    ADD COLUMN staged boolean NOT NULL DEFAULT false;

DROP FUNCTION nudge_campaign_source(text, text, regclass, name, name, name, name);

-- Registers (or replaces) an audience source, as version 20's, with an
-- optional zone column:
--   SELECT nudge_campaign_source('acme-renewals', 'acme', 'app.renewals_v',
--                                'learner_id', 'email', 'profile', 'expires_on', 'tz');
CREATE FUNCTION nudge_campaign_source(p_name text, p_tenant text, p_relation regclass,
                                      p_key name, p_recipient name, p_data name, p_date name,
                                      p_zone name DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    col name;
BEGIN
    IF p_relation = 'campaign_staged_rows'::regclass THEN
        RAISE EXCEPTION 'nudge: staged sources are registered by staging a file (nudgectl campaign stage)'
            USING ERRCODE = '22023';
    END IF;
    FOREACH col IN ARRAY array_remove(ARRAY[p_key, p_recipient, p_data, p_date, p_zone], NULL) LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
                        WHERE attrelid = p_relation AND attname = col AND attnum > 0 AND NOT attisdropped) THEN
            RAISE EXCEPTION 'nudge: % has no column %', p_relation, quote_ident(col) USING ERRCODE = '42703';
        END IF;
        IF NOT has_column_privilege('nudge_planner', p_relation, col, 'SELECT') THEN
            RAISE EXCEPTION 'nudge: nudge_planner may not read %.%', p_relation, quote_ident(col)
                USING ERRCODE = '42501', HINT = format('GRANT SELECT ON %s TO nudge_planner', p_relation);
        END IF;
    END LOOP;
    INSERT INTO campaign_sources (name, tenant, relation, key_column, recipient_column, data_column,
                                  date_column, zone_column, staged)
    VALUES (p_name, p_tenant, p_relation, p_key, p_recipient, p_data, p_date, p_zone, false)
        ON CONFLICT (name) DO UPDATE SET tenant = EXCLUDED.tenant, relation = EXCLUDED.relation,
            key_column = EXCLUDED.key_column, recipient_column = EXCLUDED.recipient_column,
            data_column = EXCLUDED.data_column, date_column = EXCLUDED.date_column,
            zone_column = EXCLUDED.zone_column, staged = false;
END $$;
REVOKE ALL ON FUNCTION nudge_campaign_source(text, text, regclass, name, name, name, name, name) FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- Staged audiences.

CREATE TABLE campaign_staged_rows (
    source    text NOT NULL,
    -- The audience key: compared bytewise, so the keyset order is the same
    -- on every database whatever its collation.
    key       text COLLATE "C" NOT NULL CHECK (key <> '' AND length(key) <= 200),
    recipient text NOT NULL,
    data      jsonb NOT NULL DEFAULT '{}',
    date      date,
    zone      text,
    line      integer NOT NULL,
    PRIMARY KEY (source, key)
);

CREATE TABLE campaign_stage_errors (
    source text NOT NULL,
    line   integer NOT NULL,
    key    text,
    field  text NOT NULL,
    reason text NOT NULL,
    PRIMARY KEY (source, line)
);

CREATE TABLE campaign_stages (
    source    text PRIMARY KEY,
    tenant    text NOT NULL,
    -- SHA-256 of the file as read and of the options it was read with.
    digest    text NOT NULL,
    file      text NOT NULL,
    rows      bigint NOT NULL,
    bad       bigint NOT NULL,
    staged_at timestamptz NOT NULL,
    staged_by text NOT NULL
);

-- Starts staging a file into source p_name of p_tenant: 'same' when the same
-- file (digest) is staged there already (nothing to do), else registers the
-- staged source, clears its old rows and errors and returns 'staging'; the
-- caller then loads the rows and errors and calls nudge_campaign_stage_end,
-- in the same transaction. Refused: a name that is a table source or
-- another tenant's, and replacing the rows of a source a campaign is still
-- planning (or paused) from.
CREATE FUNCTION nudge_campaign_stage_begin(p_name text, p_tenant text, p_digest text)
RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    src campaign_sources;
    busy bigint;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    SELECT * INTO src FROM campaign_sources WHERE name = p_name FOR UPDATE;
    IF FOUND AND NOT src.staged THEN
        RAISE EXCEPTION 'nudge: source % is a table source, not a staged one', quote_literal(p_name)
            USING ERRCODE = '22023';
    END IF;
    IF FOUND AND src.tenant <> p_tenant THEN
        RAISE EXCEPTION 'nudge: source % belongs to another tenant', quote_literal(p_name) USING ERRCODE = '42501';
    END IF;
    IF EXISTS (SELECT 1 FROM campaign_stages s WHERE s.source = p_name AND s.digest = p_digest) THEN
        RETURN 'same';
    END IF;
    SELECT c.id INTO busy FROM campaigns c
     WHERE c.source = p_name AND c.state IN ('planning', 'paused') ORDER BY c.id LIMIT 1;
    IF busy IS NOT NULL THEN
        RAISE EXCEPTION 'nudge: campaign % is still planning from source %: cancel it, or stage under another name',
            busy, quote_literal(p_name) USING ERRCODE = '55000';
    END IF;
    INSERT INTO campaign_sources (name, tenant, relation, key_column, recipient_column, data_column,
                                  date_column, zone_column, staged)
    VALUES (p_name, p_tenant, 'campaign_staged_rows'::regclass, 'key', 'recipient', 'data', 'date', 'zone', true)
        ON CONFLICT (name) DO NOTHING;
    DELETE FROM campaign_staged_rows WHERE source = p_name;
    DELETE FROM campaign_stage_errors WHERE source = p_name;
    RETURN 'staging';
END $$;

-- Ends staging: records the file's digest and counts.
CREATE FUNCTION nudge_campaign_stage_end(p_name text, p_tenant text, p_digest text, p_file text,
                                         p_at timestamptz, p_by text, OUT rows bigint, OUT bad bigint)
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    SELECT count(*) INTO rows FROM campaign_staged_rows r WHERE r.source = p_name;
    SELECT count(*) INTO bad FROM campaign_stage_errors e WHERE e.source = p_name;
    INSERT INTO campaign_stages AS s VALUES (p_name, p_tenant, p_digest, p_file, rows, bad, p_at, p_by)
        ON CONFLICT (source) DO UPDATE SET digest = EXCLUDED.digest, file = EXCLUDED.file, rows = EXCLUDED.rows,
            bad = EXCLUDED.bad, staged_at = EXCLUDED.staged_at, staged_by = EXCLUDED.staged_by;
END $$;

-- ---------------------------------------------------------------------------
-- Reading an audience (replaces version 20's): also each row's calendar day
-- (a date column's value; NULL for a timestamptz column, whose day depends
-- on the recipient's zone) and zone, and a staged source's own rows only.

DROP FUNCTION nudge_campaign_audience(bigint, text, integer);

-- The WHERE clause restricting a source's relation to its rows (staged
-- sources share one table), for the alias src.
CREATE FUNCTION nudge_campaign_scope(s campaign_sources) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN s.staged THEN format('src.source = %L', s.name) ELSE 'true' END;
$$;

CREATE FUNCTION nudge_campaign_audience(p_campaign bigint, p_after text, p_limit integer)
RETURNS TABLE (a_key text, a_recipient text, a_data jsonb, a_date timestamptz, a_day date, a_zone text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    src record;
    day_is_date boolean;
BEGIN
    SELECT * INTO STRICT src FROM nudge_campaign_source_of(p_campaign);
    SELECT a.atttypid = 'date'::regtype INTO day_is_date FROM pg_catalog.pg_attribute a
     WHERE a.attrelid = (src.s).relation AND a.attname = (src.s).date_column AND NOT a.attisdropped;
    RETURN QUERY EXECUTE format(
        -- ORDER BY names the source's column: bare, it would name the
        -- output column of the same name, the key as text, and sort 10 before 9.
        'SELECT src.%1$I::text, src.%2$I::text, %3$s, %4$s, %7$s, %8$s FROM %5$s AS src '
        'WHERE %9$s AND src.%1$I IS NOT NULL AND ($1::text IS NULL OR src.%1$I > $1::text::%6$s) '
        'ORDER BY src.%1$I LIMIT $2',
        (src.s).key_column, (src.s).recipient_column,
        CASE WHEN (src.s).data_column IS NULL THEN '''{}''::jsonb'
             ELSE format('to_jsonb(src.%I)', (src.s).data_column) END,
        CASE WHEN (src.s).date_column IS NULL THEN 'NULL::timestamptz'
             ELSE format('src.%I::timestamptz', (src.s).date_column) END,
        (src.s).relation, src.keytype,
        CASE WHEN coalesce(day_is_date, false) THEN format('src.%I', (src.s).date_column) ELSE 'NULL::date' END,
        CASE WHEN (src.s).zone_column IS NULL THEN 'NULL::text'
             ELSE format('src.%I::text', (src.s).zone_column) END,
        nudge_campaign_scope(src.s))
        USING p_after, p_limit;
END $$;

-- Counts a campaign's audience rows after p_after: the unplanned remainder.
CREATE OR REPLACE FUNCTION nudge_campaign_remaining(p_campaign bigint, p_after text)
RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE
    src record;
    n bigint;
BEGIN
    SELECT * INTO STRICT src FROM nudge_campaign_source_of(p_campaign);
    EXECUTE format('SELECT count(*) FROM %s AS src WHERE %s AND src.%I IS NOT NULL '
                   'AND ($1::text IS NULL OR src.%I > $1::text::%s)',
                   (src.s).relation, nudge_campaign_scope(src.s), (src.s).key_column, (src.s).key_column, src.keytype)
        INTO n USING p_after;
    RETURN n;
END $$;

-- The audience rows of a source, counted with the caller's rights (the
-- admission's estimate): who may not read the relation gets an error.
CREATE FUNCTION nudge_campaign_source_size(p_source text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    s campaign_sources;
    n bigint;
BEGIN
    SELECT * INTO STRICT s FROM campaign_sources WHERE name = p_source;
    EXECUTE format('SELECT count(*) FROM %s AS src WHERE %s AND src.%I IS NOT NULL',
                   s.relation, nudge_campaign_scope(s), s.key_column) INTO n;
    RETURN n;
END $$;

-- ---------------------------------------------------------------------------
-- The tenant cohort: the tenants whose campaigns may be created and planned.
-- '*' stands for every tenant (what this migration starts with, so nothing
-- changes until an operator narrows it: nudgectl campaign cohort set acme).
-- A campaign of a tenant outside the cohort is refused at create; one
-- created before its tenant left waits in 'planning', unplanned, until the
-- tenant is back (the planner drops its commands, the cron does not nudge it).

CREATE TABLE campaign_cohort (
    tenant   text PRIMARY KEY CHECK (tenant <> ''),
    added_at timestamptz NOT NULL DEFAULT now(),
    added_by text NOT NULL DEFAULT session_user
);
INSERT INTO campaign_cohort (tenant, added_by) VALUES ('*', 'migration 25');

CREATE FUNCTION nudge_campaign_enabled(p_tenant text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM campaign_cohort c WHERE c.tenant IN (p_tenant, '*'));
$$;

-- ---------------------------------------------------------------------------
-- Campaigns: the local due rules, the configured slice size, shadow runs,
-- the admission record.

ALTER TABLE campaigns
    ADD COLUMN due_local timestamp,
    ADD COLUMN at_local time,
    ADD COLUMN default_zone text NOT NULL DEFAULT 'UTC',
    -- Plan without creating sendable reminders: the counts per slice (and the
    -- keys, with shadow_keys) are recorded, the reminders rolled back.
    ADD COLUMN shadow boolean NOT NULL DEFAULT false,
    ADD COLUMN shadow_keys boolean NOT NULL DEFAULT false,
    -- The admission's numbers at create (and an operator's override, if any).
    ADD COLUMN admission jsonb,
    -- NULL: the planner's configured slice size (planner --slice-size, 200).
    ALTER COLUMN slice_size DROP NOT NULL,
    DROP CONSTRAINT campaigns_one_due_rule,
    ADD CONSTRAINT campaigns_one_due_rule CHECK (num_nonnulls(due_at, due_local, days_before) = 1),
    ADD CONSTRAINT campaigns_at_local_needs_days CHECK (at_local IS NULL OR days_before IS NOT NULL),
    ADD CONSTRAINT campaigns_shadow_keys CHECK (shadow OR NOT shadow_keys);

-- How long each slice's transaction held the campaign (lock to checkpoint),
-- by the planner's clock: the measured slice time of admission.
ALTER TABLE campaign_slices ADD COLUMN took_ms integer;

-- The audience keys a shadow campaign would have scheduled, on request.
CREATE TABLE campaign_shadow_keys (
    campaign_id  bigint NOT NULL REFERENCES campaigns (id),
    audience_key text NOT NULL,
    slice        bigint NOT NULL,
    PRIMARY KEY (campaign_id, audience_key)
);

DROP FUNCTION nudge_campaign_create(text, text, text, text, text, timestamptz, integer, timestamptz, integer, interval);

-- Creates a campaign, or returns the one of the same (tenant, name), as
-- version 20's. The parameters after p_lease are optional: a due rule in
-- local time (p_due_local, or p_days_before with p_at_local), the zone of
-- rows without one (NULL: UTC), shadow mode, and the admission record.
-- NULL p_slice_size: the planner's configured size; NULL p_lease: 30 s.
CREATE FUNCTION nudge_campaign_create(p_tenant text, p_name text, p_channel text, p_template text,
                                      p_source text, p_due_at timestamptz, p_days_before integer,
                                      p_deadline timestamptz, p_slice_size integer, p_lease interval,
                                      p_due_local timestamp DEFAULT NULL, p_at_local time DEFAULT NULL,
                                      p_default_zone text DEFAULT NULL, p_shadow boolean DEFAULT false,
                                      p_shadow_keys boolean DEFAULT false, p_admission jsonb DEFAULT NULL)
RETURNS TABLE (id bigint, created boolean)
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    RETURN QUERY SELECT c.id, false FROM campaigns c WHERE c.tenant = p_tenant AND c.name = p_name;
    IF FOUND THEN
        RETURN;
    END IF;
    IF NOT nudge_campaign_enabled(p_tenant) THEN
        RAISE EXCEPTION 'nudge: tenant % is not in the campaign cohort', quote_literal(p_tenant)
            USING ERRCODE = '42501', COLUMN = 'tenant',
                  HINT = 'an operator adds it: nudgectl campaign cohort add ' || p_tenant;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM campaign_sources s WHERE s.name = p_source AND s.tenant = p_tenant) THEN
        RAISE EXCEPTION 'nudge: field "source" names no audience source of tenant %', quote_literal(p_tenant)
            USING ERRCODE = '22023', COLUMN = 'source';
    END IF;
    IF num_nonnulls(p_due_at, p_due_local, p_days_before) <> 1 THEN
        RAISE EXCEPTION 'nudge: give exactly one due rule: "due_at", "due_local" or "days_before"'
            USING ERRCODE = '22023', COLUMN = 'due_at';
    END IF;
    IF p_at_local IS NOT NULL AND p_days_before IS NULL THEN
        RAISE EXCEPTION 'nudge: field "at_local" needs "days_before"' USING ERRCODE = '22023', COLUMN = 'at_local';
    END IF;
    IF p_days_before IS NOT NULL AND NOT EXISTS (SELECT 1 FROM campaign_sources s
                                                  WHERE s.name = p_source AND s.date_column IS NOT NULL) THEN
        RAISE EXCEPTION 'nudge: field "days_before" needs a source with a date column'
            USING ERRCODE = '22023', COLUMN = 'days_before';
    END IF;
    IF p_default_zone IS NOT NULL AND NOT nudge_valid_tz(p_default_zone) THEN
        RAISE EXCEPTION 'nudge: field "default_zone" must be an IANA time zone name such as "Europe/Stockholm", not %',
            quote_literal(p_default_zone) USING ERRCODE = '22023', COLUMN = 'default_zone';
    END IF;
    IF p_slice_size IS NOT NULL AND p_slice_size NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'nudge: field "slice_size" must be between 1 and 10000, not %', p_slice_size
            USING ERRCODE = '22023', COLUMN = 'slice_size';
    END IF;
    RETURN QUERY
    INSERT INTO campaigns AS c (tenant, name, channel, template, source, due_at, days_before, deadline,
                                slice_size, lease, due_local, at_local, default_zone, shadow, shadow_keys, admission)
    VALUES (p_tenant, p_name, p_channel, p_template, p_source, p_due_at, p_days_before, p_deadline,
            p_slice_size, coalesce(p_lease, interval '30 seconds'), p_due_local, p_at_local,
            coalesce(p_default_zone, 'UTC'), coalesce(p_shadow, false), coalesce(p_shadow_keys, false), p_admission)
    ON CONFLICT ON CONSTRAINT campaigns_name DO NOTHING
    RETURNING c.id, true;
    IF NOT FOUND THEN -- a concurrent create of the same name committed first
        RETURN QUERY SELECT c.id, false FROM campaigns c WHERE c.tenant = p_tenant AND c.name = p_name;
    END IF;
END $$;

-- Per slice, a shadow campaign's counts beside another campaign's (a real
-- run over the same source and slice size): what `campaign status` shows
-- and `nudgectl campaign compare` prints. A slice only one of them has
-- shows NULLs on the other side.
CREATE FUNCTION nudge_campaign_shadow_compare(p_shadow bigint, p_real bigint)
RETURNS TABLE (slice bigint, shadow_rows integer, shadow_intents integer, shadow_bad integer,
               real_rows integer, real_intents integer, real_bad integer, same boolean)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(s.slice, r.slice), s.rows_read, s.intents, s.bad_rows, r.rows_read, r.intents, r.bad_rows,
           (s.rows_read, s.intents, s.bad_rows) IS NOT DISTINCT FROM (r.rows_read, r.intents, r.bad_rows)
      FROM (SELECT * FROM campaign_slices WHERE campaign_id = p_shadow) s
      FULL JOIN (SELECT * FROM campaign_slices WHERE campaign_id = p_real) r ON r.slice = s.slice
     ORDER BY 1;
$$;

DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'nudge_campaign_create(text, text, text, text, text, timestamptz, integer, timestamptz, integer, interval, timestamp, time, text, boolean, boolean, jsonb)',
        'nudge_campaign_stage_begin(text, text, text)',
        'nudge_campaign_stage_end(text, text, text, text, timestamptz, text)'] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;

GRANT EXECUTE ON FUNCTION
    nudge_campaign_create(text, text, text, text, text, timestamptz, integer, timestamptz, integer, interval,
                          timestamp, time, text, boolean, boolean, jsonb)
    TO nudge_intake, nudge_operator;
-- Staging is an operator's (nudgectl), for any tenant.
GRANT EXECUTE ON FUNCTION nudge_campaign_stage_begin(text, text, text),
                          nudge_campaign_stage_end(text, text, text, text, timestamptz, text)
    TO nudge_operator;
GRANT SELECT, INSERT ON campaign_staged_rows, campaign_stage_errors TO nudge_operator;
GRANT SELECT ON campaign_stages, campaign_shadow_keys TO nudge_operator;
GRANT SELECT, INSERT, DELETE ON campaign_cohort TO nudge_operator;

-- The planner reads staged rows (the keyset scan), the cohort, and records
-- a slice's time and a shadow campaign's keys.
GRANT SELECT ON campaign_staged_rows, campaign_cohort TO nudge_planner;
GRANT SELECT, INSERT ON campaign_shadow_keys TO nudge_planner;
