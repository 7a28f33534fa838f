-- Nudge schema, version 5: fleet-wide rate limits. One row per limited key
-- ("account:<name>", "tenant:<channel>:<tenant>") holding its GCRA
-- theoretical arrival time; every worker replica takes its tokens from here,
-- a batch at a time, so a limit holds however many replicas run.

CREATE TABLE rate_limits (
    key text        PRIMARY KEY,
    tat timestamptz NOT NULL
);

-- Takes up to p_want tokens from every key at once (all keys grant the same
-- number: a send needs a token of its account and of its tenant). Keys must
-- come sorted, so concurrent callers lock them in one order. Each key allows
-- bursts of p_burst and refills one token per p_interval_us microseconds.
-- Returns how many were granted and, when fewer than wanted, when the next
-- token of every key will be free.
CREATE FUNCTION nudge_rate_acquire(p_keys text[], p_interval_us bigint[], p_burst integer[],
                                   p_want integer, p_now timestamptz,
                                   OUT granted integer, OUT retry_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    n     integer := coalesce(array_length(p_keys, 1), 0);
    tats  timestamptz[] := '{}';
    t     timestamptz;
    iv    interval;
    avail integer;
BEGIN
    granted := p_want;
    FOR i IN 1 .. n LOOP
        INSERT INTO rate_limits (key, tat) VALUES (p_keys[i], p_now) ON CONFLICT (key) DO NOTHING;
        SELECT greatest(l.tat, p_now) INTO t FROM rate_limits l WHERE l.key = p_keys[i] FOR UPDATE;
        tats := tats || t;
        iv := p_interval_us[i] * interval '1 microsecond';
        -- k tokens fit while t + k*iv - now <= burst*iv
        avail := floor(extract(epoch FROM (p_now + p_burst[i] * iv - t)) / extract(epoch FROM iv));
        granted := least(granted, greatest(avail, 0));
    END LOOP;
    FOR i IN 1 .. n LOOP
        iv := p_interval_us[i] * interval '1 microsecond';
        IF granted > 0 THEN
            UPDATE rate_limits SET tat = tats[i] + granted * iv WHERE key = p_keys[i];
        END IF;
        IF granted < p_want THEN
            retry_at := greatest(retry_at, tats[i] + (granted + 1) * iv - p_burst[i] * iv);
        END IF;
    END LOOP;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'nudge_worker') THEN
        GRANT SELECT, INSERT, UPDATE ON rate_limits TO nudge_worker;
    END IF;
END $$;
