-- Nudge schema, version 11: recipient-local time, the SQL twin of
-- pkg/localtime (docs/local-time.md). Pure functions only: later migrations
-- add the columns that use them (a reminder's tz and send window, the
-- per-tenant, per-channel window policy) and the claim that calls them.
--
-- The rules are pkg/localtime's, and a test (pkg/localtime/agreement_test.go)
-- holds the two to the same answers for every zone both zone databases know:
--
--   * a local time the clock skips (spring forward) moves forward by the gap;
--   * a local time the clock shows twice (fall back) is the earlier instant;
--   * a window opens each chosen day at resolve(day + open) and closes at
--     resolve(day + close), or the next day's close when close <= open; an
--     opening whose close resolves no later than its open does not happen.
--
-- PostgreSQL's own `timestamp AT TIME ZONE` moves a gap forward too but takes
-- the later instant in an overlap, so nudge_resolve_local chooses explicitly.
-- Nothing here depends on the session's TimeZone setting.
--
-- Volatility: the resolving and window functions are IMMUTABLE, as
-- PostgreSQL's timezone(text, timestamp) is: their answers change only when
-- the server's zone database is updated. Do not index their results for that
-- reason. Names resolve through the caller's search_path (as the other
-- nudge_ functions do): callers run with this schema on it.

-- ---------------------------------------------------------------------------
-- Zones.

-- The zone names a reminder may use, copied from pg_timezone_names when this
-- migration ran: that view reads every zone file of the server on each scan
-- (about 0.2 s), too slow to consult per row. nudge_valid_tz falls back to
-- the view for a name missing here (a zone added by a later zone-database
-- update), so the copy only has to be fast, never complete; to refresh it:
--   INSERT INTO nudge_time_zones SELECT name FROM pg_timezone_names
--    WHERE nudge_valid_tz(name) ON CONFLICT DO NOTHING;
CREATE TABLE nudge_time_zones (
    name text PRIMARY KEY
);

-- Names the zone database knows but a reminder must not use: the server's
-- own zone, a POSIX template, "no zone", the posix/ and right/ copies, and
-- legacy names that AT TIME ZONE reads as abbreviations before zones
-- (timezone_abbreviations): 'CET' as a fixed +01:00 with no summer time,
-- 'EST' as +10:00 under the Australia set. UTC, GMT, UCT and Zulu are UTC
-- in every set. localtime.LoadZone refuses the same names.
CREATE FUNCTION nudge_tz_name_allowed(p_tz text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_tz <> ''
       AND p_tz NOT IN ('Local', 'localtime', 'posixrules', 'Factory',
                        'CET', 'EET', 'MET', 'WET', 'EST', 'MST', 'HST')
       AND p_tz !~ '^(posix|right)/'
       AND p_tz = btrim(p_tz)
$$;

INSERT INTO nudge_time_zones (name)
SELECT name FROM pg_catalog.pg_timezone_names WHERE nudge_tz_name_allowed(name);

-- Whether p_tz is an IANA zone name a reminder may use, matched exactly (case
-- included: AT TIME ZONE would accept 'europe/stockholm', abbreviations such
-- as 'CEST' and POSIX strings such as 'UTC+3', and Go would not).
CREATE FUNCTION nudge_valid_tz(p_tz text) RETURNS boolean
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    IF p_tz IS NULL OR NOT nudge_tz_name_allowed(p_tz) THEN
        RETURN false;
    END IF;
    RETURN EXISTS (SELECT 1 FROM nudge_time_zones z WHERE z.name = p_tz)
        OR EXISTS (SELECT 1 FROM pg_catalog.pg_timezone_names n WHERE n.name = p_tz);
END $$;

-- ---------------------------------------------------------------------------
-- Resolving a local wall-clock time.

-- The instant at which the local clock in p_tz shows p_wall. Candidates are
-- p_wall read with the offset in force a day before and a day after; a
-- candidate the clock really shows at is valid, the earlier valid one wins
-- (overlap), and with none (gap) p_wall is read with the offset before.
-- This assumes no two transitions within 48 hours of each other, which no
-- zone has in 2020-2030 (the agreement test checks every zone; Go's Resolve
-- walks the transitions instead).
CREATE FUNCTION nudge_resolve_local(p_wall timestamp, p_tz text) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    u      constant timestamptz := p_wall AT TIME ZONE 'UTC';
    before constant timestamptz := u - (((u - interval '24 hours') AT TIME ZONE p_tz) - (p_wall - interval '24 hours'));
    after  constant timestamptz := u - (((u + interval '24 hours') AT TIME ZONE p_tz) - (p_wall + interval '24 hours'));
    before_ok constant boolean := (before AT TIME ZONE p_tz) = p_wall;
    after_ok  constant boolean := (after AT TIME ZONE p_tz) = p_wall;
BEGIN
    RETURN CASE
        WHEN before_ok AND after_ok THEN least(before, after)
        WHEN before_ok THEN before
        WHEN after_ok THEN after
        ELSE before -- in a gap: forward by the gap
    END;
END $$;

-- ---------------------------------------------------------------------------
-- Send windows. A window is (p_open, p_close, p_days): daily local times,
-- p_close '24:00' for the end of the day, p_close <= p_open for an overnight
-- window (the day is the one it opens on), p_days a bit set of the days it
-- opens on (bit 1 << extract(dow): Sunday is 1, Monday 2 ... Saturday 64;
-- 0 or NULL for every day), as localtime.Window's Opens, Closes and Days.
-- p_open NULL means any time. Invalid windows raise 22023.

CREATE FUNCTION nudge_window_check(p_open time, p_close time, p_days integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF p_open IS NULL THEN
        RETURN;
    END IF;
    IF p_open >= time '24:00' OR p_close IS NULL OR p_close = time '00:00' OR p_close = p_open
       OR coalesce(p_days, 0) NOT BETWEEN 0 AND 127 THEN
        RAISE EXCEPTION 'nudge: invalid send window (open %, close %, days %)', p_open, p_close, p_days
            USING ERRCODE = '22023',
                  HINT = 'open 00:00-23:59, close 00:01-24:00 and not equal to open, days a bit set 0-127; open NULL for any time';
    END IF;
END $$;

-- The opening that starts on the local date p_day, or NULLs when the window
-- does not open that day (not one of p_days, or emptied by a gap).
CREATE FUNCTION nudge_window_opening(p_day date, p_open time, p_close time, p_days integer, p_tz text,
                                     OUT opens_at timestamptz, OUT closes_at timestamptz)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF coalesce(p_days, 0) <> 0 AND p_days & (1 << extract(dow FROM p_day)::integer) = 0 THEN
        RETURN;
    END IF;
    opens_at := nudge_resolve_local(p_day + p_open, p_tz);
    closes_at := nudge_resolve_local(p_day + CASE WHEN p_close <= p_open THEN 1 ELSE 0 END + p_close, p_tz);
    IF closes_at <= opens_at THEN
        opens_at := NULL;
        closes_at := NULL;
    END IF;
END $$;

-- Whether the window is open at p_at in p_tz. Only openings that start on
-- p_at's local date, up to two days before, or the next day (a zone that
-- falls back across midnight) can hold it. Mirrors localtime.Open.
CREATE FUNCTION nudge_window_open(p_open time, p_close time, p_days integer, p_tz text, p_at timestamptz)
RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    d0 date;
    o  record;
BEGIN
    IF p_open IS NULL THEN
        RETURN true;
    ELSIF p_at IS NULL OR p_tz IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM nudge_window_check(p_open, p_close, p_days);
    d0 := (p_at AT TIME ZONE p_tz)::date;
    FOR i IN -2 .. 1 LOOP
        o := nudge_window_opening(d0 + i, p_open, p_close, p_days, p_tz);
        IF p_at >= o.opens_at AND p_at < o.closes_at THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END $$;

-- p_at if the window is open then, else when it next opens: the earliest
-- opening after p_at among the days from p_at's local date -1 on, stopping
-- one day after the first found (a gap can reorder two neighbouring days'
-- openings, never more) and after 15 days. Mirrors localtime.NextOpening.
CREATE FUNCTION nudge_next_opening(p_open time, p_close time, p_days integer, p_tz text, p_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    d0       date;
    o        record;
    best     timestamptz;
    best_day integer;
BEGIN
    IF nudge_window_open(p_open, p_close, p_days, p_tz, p_at) IS DISTINCT FROM false THEN
        RETURN p_at; -- open, or NULL for a NULL p_at or p_tz
    END IF;
    d0 := (p_at AT TIME ZONE p_tz)::date;
    FOR i IN -1 .. 15 LOOP
        EXIT WHEN best IS NOT NULL AND i > best_day + 1;
        o := nudge_window_opening(d0 + i, p_open, p_close, p_days, p_tz);
        IF o.opens_at > p_at AND (best IS NULL OR o.opens_at < best) THEN
            best := o.opens_at;
            best_day := i;
        END IF;
    END LOOP;
    RETURN best;
END $$;

-- ---------------------------------------------------------------------------
-- Privileges: functions are executable by PUBLIC unless revoked. These are
-- pure, but kept to the component roles like everything else (a function
-- called from another needs its own grant: the window functions call the
-- resolver). Retention deletes old rows and needs none of them.

REVOKE EXECUTE ON FUNCTION
    nudge_tz_name_allowed(text),
    nudge_valid_tz(text),
    nudge_resolve_local(timestamp, text),
    nudge_window_check(time, time, integer),
    nudge_window_opening(date, time, time, integer, text),
    nudge_window_open(time, time, integer, text, timestamptz),
    nudge_next_opening(time, time, integer, text, timestamptz)
  FROM PUBLIC;

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['nudge_intake', 'nudge_dispatcher', 'nudge_worker',
                             'nudge_reconciler', 'nudge_operator'] LOOP
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r);
        EXECUTE format('GRANT SELECT ON nudge_time_zones TO %I', r);
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            nudge_tz_name_allowed(text),
            nudge_valid_tz(text),
            nudge_resolve_local(timestamp, text),
            nudge_window_check(time, time, integer),
            nudge_window_opening(date, time, time, integer, text),
            nudge_window_open(time, time, integer, text, timestamptz),
            nudge_next_opening(time, time, integer, text, timestamptz)
          TO %I', r);
    END LOOP;
END $$;
