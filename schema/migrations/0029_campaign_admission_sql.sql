-- Nudge schema, version 29: deadline-aware admission for the web tier's
-- nudge_campaign_create (issue 15, last gap).
--
-- `nudgectl campaign create` decides admission in Go (campaign.Assess/Admit)
-- with the workers' limits file and retry flags on its command line. The web
-- tier has neither, so an operator stores them here:
--
--   nudgectl campaign rates --limits /etc/nudge/limits.json --max-attempts 5 ...
--
-- writes the sends per second the file gives each channel (per tenant named
-- in it, and for every other tenant), computed by the same Go function the
-- CLI's admission uses, the retry budget, and the planner's slice size, in
-- one transaction. nudge_campaign_create then admits a web tier's campaign
-- with the same rule (nudge_campaign_admit, checked against campaign.Admit by
-- a table test that runs both on the same inputs) and refuses it with
-- SQLSTATE NC001 and a message that prints every number; p_admit_anyway
-- (a reason) creates it regardless, recorded with the numbers in
-- campaigns.admission, as --admit-anyway does.
--
-- Without stored rates the web tier's campaign is judged as `nudgectl
-- campaign create` without --limits judges one: no delivery budget (no rate
-- limit known) and the workers' default retry budget (5 attempts, backoff 1s
-- doubling: 15 s); the admission record says so.
--
-- Who is admission-checked here: callers that may not write reminders
-- themselves (the web tier's nudge_intake logins: the line
-- nudge_tenant_allowed draws). Operators and the owner bring their own
-- admission (nudgectl's, in p_admission), as before.

CREATE TABLE campaign_admission_budget (
    -- One row: the budget in force.
    one            boolean PRIMARY KEY DEFAULT true CHECK (one),
    limits_from    text NOT NULL,
    limits_version text NOT NULL,
    -- The retry budget: one reminder's retries, in nanoseconds (as Go's
    -- time.Duration, the admission record's unit), and how it was computed.
    retry_ns       bigint NOT NULL CHECK (retry_ns >= 0),
    retry_from     text NOT NULL,
    -- The planner's --slice-size: the size of a campaign that sets none.
    slice_size     integer NOT NULL CHECK (slice_size BETWEEN 1 AND 10000),
    stored_at      timestamptz NOT NULL,
    stored_by      text NOT NULL
);

-- Sends per second per channel: tenant '' is every tenant without a row of
-- its own; rate 0 is no limit. Every channel has its '' row once stored.
CREATE TABLE campaign_admission_rates (
    channel   text NOT NULL CHECK (channel IN ('email', 'sms', 'webhook')),
    tenant    text NOT NULL,
    rate      float8 NOT NULL CHECK (rate >= 0),
    rate_from text NOT NULL,
    PRIMARY KEY (channel, tenant)
);

GRANT SELECT, INSERT, DELETE ON campaign_admission_budget, campaign_admission_rates TO nudge_operator;

-- The planning time per audience row of this installation: the 95th
-- percentile of took_ms / rows_read over the last p_slices slices that read
-- at least p_min_rows rows (the last, short slice of a campaign would
-- overstate it), and how many there were. campaign.Assess reads it too.
CREATE FUNCTION nudge_campaign_row_time(p_slices integer, p_min_rows integer,
                                        OUT n integer, OUT per_row_ms float8)
LANGUAGE sql STABLE AS $$
    SELECT count(*)::integer, percentile_cont(0.95) WITHIN GROUP (ORDER BY took_ms::float8 / rows_read)
      FROM (SELECT took_ms, rows_read FROM campaign_slices
             WHERE took_ms IS NOT NULL AND rows_read >= p_min_rows
             ORDER BY at DESC LIMIT p_slices) s;
$$;
REVOKE ALL ON FUNCTION nudge_campaign_row_time(integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION nudge_campaign_row_time(integer, integer) TO nudge_operator;

-- The admission rule, as campaign.Admit: p_in is an AdmissionInput as JSON
-- (times RFC 3339, durations in nanoseconds), the result an Admission.
-- The window from now to the deadline must cover planning (slices × slice
-- time, a slice being row_time × slice size + the 250 ms hop of the next
-- command), then delivery (audience ÷ rate, from the due time at the
-- earliest), then one reminder's retries. Computed in nanoseconds, so the
-- verdict is exactly Go's.
CREATE FUNCTION nudge_campaign_admit(p_in jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    hop        constant bigint := 250000000; -- campaign.SliceHop
    t_now      constant timestamptz := (p_in->>'now')::timestamptz;
    t_deadline constant timestamptz := (p_in->>'deadline')::timestamptz;
    t_from     constant timestamptz := (p_in->>'delivery_from')::timestamptz;
    audience   constant bigint := coalesce((p_in->>'audience')::bigint, 0);
    size       constant bigint := greatest(coalesce((p_in->>'slice_size')::bigint, 0), 1);
    row_time   constant bigint := coalesce((p_in->>'row_time')::bigint, 0);
    rate       constant float8 := coalesce((p_in->>'rate')::float8, 0);
    retry      constant bigint := coalesce((p_in->>'retry')::bigint, 0);
    slices     bigint;
    slice_time bigint;
    planning   bigint;
    delivery   bigint := 0;
    start_off  bigint;
    due_off    numeric;
    need       bigint;
    win        bigint;
BEGIN
    slices := (audience + size - 1) / size;
    IF slices = 0 THEN
        slices := 1; -- the slice that finds the audience empty
    END IF;
    slice_time := row_time * size + hop;
    planning := slices * slice_time;
    IF rate > 0 THEN
        delivery := ceil(audience::float8 / rate * 1e9::float8)::bigint;
    END IF;
    start_off := planning;
    -- In numeric: Go's zero time (year 1) is further back than a bigint of
    -- nanoseconds reaches.
    due_off := (extract(epoch FROM t_from) - extract(epoch FROM t_now)) * 1000000000;
    IF due_off > planning THEN
        start_off := due_off::bigint;
    END IF;
    need := start_off + delivery + retry;
    win := ((extract(epoch FROM t_deadline) - extract(epoch FROM t_now)) * 1000000000)::bigint;
    RETURN p_in || jsonb_build_object(
        'slices', slices, 'slice_time', slice_time, 'planning', planning, 'delivery', delivery,
        'finish', t_now + (need / 1000) * interval '1 microsecond', 'window', win, 'need', need,
        'admitted', need <= win OR coalesce(p_in->>'override', '') <> '');
END $$;
GRANT EXECUTE ON FUNCTION nudge_campaign_admit(jsonb) TO nudge_intake, nudge_operator;

-- Nanoseconds (a JSON number of an admission record) as seconds, to the millisecond.
CREATE FUNCTION nudge_ns_seconds(ns jsonb) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$ SELECT round((ns #>> '{}')::numeric / 1e9, 3) $$;

-- Every number of an admission, as text (the refusal's message), line for
-- line as campaign.Admission.String prints it (durations in seconds).
CREATE FUNCTION nudge_campaign_admission_text(a jsonb) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format('window %s s: from now %s to the deadline %s', nudge_ns_seconds(a->'window'), a->>'now', a->>'deadline')
        || E'\n' || format('planning %s s: %s audience rows (%s) / slice size %s = %s slices × %s s (%s ms per row, %s; '
                          '+ 0.25 s per slice for the next command)',
                          nudge_ns_seconds(a->'planning'), a->>'audience', a->>'audience_from', a->>'slice_size',
                          a->>'slices', nudge_ns_seconds(a->'slice_time'), round((a->>'row_time')::numeric / 1e6, 3),
                          a->>'row_time_from')
        || E'\n' || CASE WHEN (a->>'rate')::float8 > 0
                         THEN format('delivery %s s: %s reminders / %s sends per second (%s)',
                                     nudge_ns_seconds(a->'delivery'), a->>'audience', a->>'rate', a->>'rate_from')
                         ELSE format('delivery 0 s: no rate limit (%s)', a->>'rate_from') END
        || CASE WHEN (a->>'delivery_from')::timestamptz > '0001-01-02'
                THEN format(', starting at the due time %s at the earliest', a->>'delivery_from') ELSE '' END
        || E'\n' || format('retries %s s: %s', nudge_ns_seconds(a->'retry'), a->>'retry_from')
        || E'\n' || format('needs %s s, done at %s; the window is %s s', nudge_ns_seconds(a->'need'), a->>'finish',
                           nudge_ns_seconds(a->'window'))
        || CASE WHEN coalesce(a->>'override', '') <> '' THEN E'\nadmitted by override: ' || (a->>'override') ELSE '' END;
$$;
GRANT EXECUTE ON FUNCTION nudge_campaign_admission_text(jsonb) TO nudge_intake, nudge_operator;

-- The admission of a campaign the web tier creates: its inputs gathered as
-- campaign.Assess gathers them (the audience counted in the source, the
-- slice time measured from this installation's checkpoints, the rate and the
-- retry budget an operator stored), then nudge_campaign_admit. Runs inside
-- nudge_campaign_create (SECURITY DEFINER): it counts the source with the
-- owner's rights, or, when the owner may not read it, takes the row count
-- PostgreSQL last estimated (ANALYZE); neither: an error that says so.
CREATE FUNCTION nudge_campaign_assess(p_tenant text, p_channel text, p_source text, p_due_at timestamptz,
                                      p_due_local timestamp, p_default_zone text, p_deadline timestamptz,
                                      p_slice_size integer, p_override text)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    b          campaign_admission_budget;
    stored     boolean;
    r          campaign_admission_rates;
    aud        bigint;
    aud_from   text := 'counted in the source';
    measured   integer;
    per_row    float8;
    row_time   bigint := 10000000;   -- campaign.DefaultRowTime
    row_from   text;
    rate       float8 := 0;
    rate_from  text;
    retry      bigint := 15000000000; -- the workers' defaults: 5 attempts, 1s doubling (1+2+4+8 s)
    retry_from text := '5 attempts, backoff 1s doubling to at most 1h0m0s (the workers'' defaults: no retry budget '
                       'stored, nudgectl campaign rates)';
BEGIN
    SELECT * INTO b FROM campaign_admission_budget;
    stored := FOUND;
    BEGIN
        aud := nudge_campaign_source_size(p_source);
    EXCEPTION WHEN insufficient_privilege THEN
        SELECT CASE WHEN cl.relkind IN ('r', 'm', 'p') AND cl.reltuples >= 0 THEN cl.reltuples::bigint END INTO aud
          FROM campaign_sources s JOIN pg_catalog.pg_class cl ON cl.oid = s.relation
         WHERE s.name = p_source;
        IF aud IS NULL THEN
            RAISE EXCEPTION 'nudge: admission cannot count the audience of source %: the schema owner may not read it, '
                            'and PostgreSQL has no row count for it yet', quote_literal(p_source)
                USING ERRCODE = '42501', HINT = 'grant the schema owner SELECT on the source, or ANALYZE it';
        END IF;
        aud_from := 'estimated from the source''s row count: the schema owner may not read it';
    END;
    -- campaign.MinSlicesMeasured, slicesMeasured, minRowsMeasured.
    SELECT t.n, t.per_row_ms INTO measured, per_row FROM nudge_campaign_row_time(1000, 20) t;
    IF measured >= 10 AND per_row IS NOT NULL THEN
        row_time := trunc(per_row * 1e6::float8)::bigint;
        row_from := format('p95 of the last %s slices of this installation', measured);
    ELSE
        row_from := format('the default: %s measured slices, %s needed', measured, 10);
    END IF;
    IF stored THEN
        SELECT * INTO r FROM campaign_admission_rates
         WHERE channel = p_channel AND tenant IN (p_tenant, '') ORDER BY tenant DESC LIMIT 1;
        IF FOUND THEN
            rate := r.rate;
            rate_from := r.rate_from;
        ELSE
            rate_from := format('no limit for channel "%s" in %s', p_channel, b.limits_from);
        END IF;
        retry := b.retry_ns;
        retry_from := b.retry_from;
    ELSE
        rate_from := 'no rates stored: no delivery budget (an operator stores them: nudgectl campaign rates --limits FILE)';
    END IF;
    RETURN nudge_campaign_admit(jsonb_build_object(
        'now', now(), 'deadline', p_deadline,
        -- The due time: a fixed one, or a local one read in the default zone;
        -- none for due times of each recipient's own (taken as soon as planned).
        'delivery_from', coalesce(p_due_at, nudge_resolve_local(p_due_local, coalesce(p_default_zone, 'UTC'))),
        'audience', aud, 'audience_from', aud_from,
        'slice_size', coalesce(p_slice_size, b.slice_size, 200),
        'row_time', row_time, 'row_time_from', row_from,
        'rate', rate, 'rate_from', rate_from, 'retry', retry, 'retry_from', retry_from)
        || CASE WHEN coalesce(p_override, '') <> '' THEN jsonb_build_object('override', p_override) ELSE '{}' END);
END $$;
REVOKE ALL ON FUNCTION nudge_campaign_assess(text, text, text, timestamptz, timestamp, text, timestamptz, integer, text)
    FROM PUBLIC;

-- Version 25's nudge_campaign_create keeps its body (every check, the
-- insert) under another name, callable only by the new one below.
ALTER FUNCTION nudge_campaign_create(text, text, text, text, text, timestamptz, integer, timestamptz, integer, interval,
                                     timestamp, time, text, boolean, boolean, jsonb)
    RENAME TO nudge_campaign_create_v25;
REVOKE ALL ON FUNCTION nudge_campaign_create_v25(text, text, text, text, text, timestamptz, integer, timestamptz, integer,
                                                 interval, timestamp, time, text, boolean, boolean, jsonb)
    FROM PUBLIC, nudge_intake, nudge_operator;

-- Creates a campaign, or returns the one of the same (tenant, name), as
-- version 25's, admission-checked for the web tier: a caller that may not
-- write reminders itself (nudge_intake) has a new campaign assessed here
-- (its p_admission is replaced by the record) and refused with SQLSTATE
-- NC001 and every number, unless p_admit_anyway gives a reason, which is
-- recorded. Operators and the owner pass their own record in p_admission
-- (nudgectl campaign create decides with the limits file on its command
-- line). What the admission cannot judge (an unknown source, no due rule, a
-- bad zone) is left to version 25's checks, which name the field.
CREATE FUNCTION nudge_campaign_create(p_tenant text, p_name text, p_channel text, p_template text,
                                      p_source text, p_due_at timestamptz, p_days_before integer,
                                      p_deadline timestamptz, p_slice_size integer, p_lease interval,
                                      p_due_local timestamp DEFAULT NULL, p_at_local time DEFAULT NULL,
                                      p_default_zone text DEFAULT NULL, p_shadow boolean DEFAULT false,
                                      p_shadow_keys boolean DEFAULT false, p_admission jsonb DEFAULT NULL,
                                      p_admit_anyway text DEFAULT NULL)
RETURNS TABLE (id bigint, created boolean)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    adm jsonb := p_admission;
BEGIN
    PERFORM nudge_check_tenant(p_tenant);
    IF length(p_admit_anyway) > 500 THEN
        RAISE EXCEPTION 'nudge: field "admit_anyway" must be at most 500 characters, not %', length(p_admit_anyway)
            USING ERRCODE = '22023', COLUMN = 'admit_anyway';
    END IF;
    -- The web tier: the line nudge_tenant_allowed draws (session_user: inside
    -- this function current_user is its owner).
    IF NOT has_any_column_privilege(session_user, 'reminders', 'INSERT') THEN
        adm := NULL;
        IF NOT EXISTS (SELECT 1 FROM campaigns c WHERE c.tenant = p_tenant AND c.name = p_name)
           AND EXISTS (SELECT 1 FROM campaign_sources s WHERE s.name = p_source AND s.tenant = p_tenant)
           AND p_deadline IS NOT NULL AND num_nonnulls(p_due_at, p_due_local, p_days_before) = 1
           AND (p_default_zone IS NULL OR nudge_valid_tz(p_default_zone))
           AND (p_slice_size IS NULL OR p_slice_size BETWEEN 1 AND 10000) THEN
            adm := nudge_campaign_assess(p_tenant, p_channel, p_source, p_due_at, p_due_local, p_default_zone,
                                         p_deadline, p_slice_size, p_admit_anyway);
            IF NOT (adm->>'admitted')::boolean THEN
                RAISE EXCEPTION E'nudge: campaign % of tenant % not admitted: it cannot be planned and delivered before its deadline\n%',
                    quote_literal(p_name), quote_literal(p_tenant), nudge_campaign_admission_text(adm)
                    USING ERRCODE = 'NC001', COLUMN = 'deadline', DETAIL = adm::text,
                          HINT = 'a later deadline, a larger slice size, a higher rate (nudgectl campaign rates), '
                                 'or p_admit_anyway => ''the reason''';
            END IF;
        END IF;
    END IF;
    RETURN QUERY SELECT * FROM nudge_campaign_create_v25(p_tenant, p_name, p_channel, p_template, p_source, p_due_at,
        p_days_before, p_deadline, p_slice_size, p_lease, p_due_local, p_at_local, p_default_zone, p_shadow,
        p_shadow_keys, adm);
END $$;

DO $$
DECLARE
    f text;
BEGIN
    f := 'nudge_campaign_create(text, text, text, text, text, timestamptz, integer, timestamptz, integer, interval, '
         'timestamp, time, text, boolean, boolean, jsonb, text)';
    EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO nudge_intake, nudge_operator', f);
END $$;
