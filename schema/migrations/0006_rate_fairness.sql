-- Nudge schema, version 6: paced, fair rate limits.
--
-- Version 5 granted tokens "now" to whoever asked first. Under contention that
-- let the tenants with the most messages in flight take most of a provider
-- account, and sends granted together reached the provider together. Here an
-- account's capacity is reserved as send slots (a worker sends each message at
-- its slot, at most a short horizon ahead), and each flow (one channel's
-- tenant on the account) may reserve only its max-min fair share of the
-- account among the flows that have messages waiting for it. A flow's own
-- configured limit caps its share.

CREATE TABLE rate_flows (
    account   text        NOT NULL,
    flow      text        NOT NULL,            -- "<channel>:<tenant>"
    cap       double precision,                -- the flow's own limit, sends/s; NULL: none
    tat       timestamptz NOT NULL,            -- GCRA theoretical arrival time at the flow's share
    queue_tat timestamptz NOT NULL,            -- when the flow's new deferred messages should all be served
    waiting   timestamptz NOT NULL,            -- the latest turn given to a deferred message
    last_ask  timestamptz NOT NULL,
    share     double precision NOT NULL,       -- the flow's share at its last ask, sends/s
    PRIMARY KEY (account, flow)
);
-- No index beyond the key: every reservation rewrites its two rows, and an
-- update that changes no indexed column stays on its page (HOT), which
-- keeps these few hot rows small. Each reservation reads all of an
-- account's flows (the tenants that ever sent through it).

-- Reserves up to p_want send slots for one flow on one account.
--
-- The account (p_rate sends/s, bursts of p_burst) hands out slots in time
-- order (GCRA), never sooner than p_lead and never more than p_horizon ahead
-- of p_now. The flow first needs
-- tokens of its own key, whose rate is its share: account capacity split
-- max-min fairly among the active flows, each capped by its own limit
-- (p_cap). A flow is active while it has messages waiting (turns given up to
-- p_active ago; a message comes back at its turn or a little after) and they
-- do come back: it asked within p_active or two of its intervals. A flow
-- whose messages are stuck behind a backlog in the queue gives its share to
-- the others until they arrive. The flow key banks up to p_bank of its
-- share so that a flow whose messages come back in bunches loses none of it,
-- but never more than keeps it under p_cap + p_flow_burst in any second.
--
-- The first p_want - p_fresh messages asked for are ones that waited before;
-- the last p_fresh are new. New messages that get no slot queue behind the
-- flow's earlier deferred ones: queue_at is the first such message's turn,
-- the next ones follow at the flow's cap (or the account's rate). next_at is
-- when the flow's next slot can be reserved (for the ones that waited before
-- and get none). share is the flow's rate now.
CREATE FUNCTION nudge_rate_reserve(
    p_account text, p_rate double precision, p_burst integer,
    p_flow text, p_cap double precision, p_flow_burst integer,
    p_want integer, p_fresh integer, p_now timestamptz,
    p_lead interval, p_horizon interval, p_active interval, p_bank interval,
    OUT slots timestamptz[], OUT share double precision,
    OUT next_at timestamptz, OUT queue_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    acc_key   text := 'account:' || p_account;
    a_iv      interval := make_interval(secs => 1.0 / p_rate);
    a_tau     interval := (p_burst - 1) * make_interval(secs => 1.0 / p_rate);
    a_tat     timestamptz;
    f_tat     timestamptz;
    f_queue   timestamptz;
    f_waiting timestamptz;
    granted   integer;
    old_denied integer;
    new_denied integer;
    f_iv      interval;
    q_iv      interval;
    f_burst   integer;
    remaining double precision := p_rate;
    n_left    integer;
    a_flows   text[];
    a_caps    double precision[];
    s         double precision;
    avail     integer;
    t         timestamptz;
BEGIN
    -- Limiter state is soft: losing the last commits in a PostgreSQL crash
    -- re-grants at most a few slots, so the commit need not wait for the WAL
    -- flush (about 70 us here, most of a call). SET LOCAL lasts to the end
    -- of the transaction: call this in one of its own (ratelimit.Limiter
    -- does, through the pool), never inside one that records reminders.
    SET LOCAL synchronous_commit = off;
    slots := '{}';
    -- The account row serializes every reservation on the account.
    SELECT greatest(l.tat, p_now) INTO a_tat FROM rate_limits l WHERE l.key = acc_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO rate_limits (key, tat) VALUES (acc_key, p_now) ON CONFLICT (key) DO NOTHING;
        SELECT greatest(l.tat, p_now) INTO a_tat FROM rate_limits l WHERE l.key = acc_key FOR UPDATE;
    END IF;

    SELECT greatest(r.tat, p_now), greatest(r.queue_tat, p_now), r.waiting INTO f_tat, f_queue, f_waiting
      FROM rate_flows r WHERE r.account = p_account AND r.flow = p_flow FOR UPDATE;
    IF NOT FOUND THEN
        -- Under the account's lock: no other caller inserts this flow now.
        INSERT INTO rate_flows (account, flow, cap, tat, queue_tat, waiting, last_ask, share)
        VALUES (p_account, p_flow, p_cap, p_now, p_now, '-infinity', p_now, p_rate);
        f_tat := p_now;
        f_queue := p_now;
        f_waiting := '-infinity';
    END IF;

    -- Max-min fair share (water filling): the flows with the smallest caps
    -- take their caps, the rest split what is left evenly.
    SELECT array_agg(r.flow ORDER BY r.cap ASC NULLS LAST, r.flow),
           array_agg(r.cap ORDER BY r.cap ASC NULLS LAST, r.flow)
      INTO a_flows, a_caps
      FROM rate_flows r
     WHERE r.account = p_account
       AND (r.flow = p_flow
            OR (r.waiting > p_now - p_active
                AND r.last_ask > p_now - greatest(p_active, make_interval(secs => 2 / r.share))));
    n_left := array_length(a_flows, 1);
    share := p_rate;
    FOR i IN 1 .. array_length(a_flows, 1) LOOP
        s := least(coalesce(a_caps[i], 'infinity'::double precision), remaining / n_left);
        IF a_flows[i] = p_flow THEN
            share := s;
        END IF;
        remaining := remaining - s;
        n_left := n_left - 1;
    END LOOP;
    IF p_cap IS NOT NULL THEN
        share := least(share, p_cap);
    END IF;

    f_iv := make_interval(secs => 1.0 / share);
    f_burst := ceil(share * extract(epoch FROM p_bank))::integer;
    IF p_cap IS NOT NULL THEN
        f_burst := least(f_burst, floor(p_cap - share)::integer + p_flow_burst);
    END IF;
    f_burst := greatest(f_burst, 1);
    -- k flow tokens are free while f_tat + k*f_iv - now <= f_burst*f_iv.
    avail := floor(extract(epoch FROM (p_now + f_burst * f_iv - f_tat)) / extract(epoch FROM f_iv));
    avail := least(greatest(avail, 0), p_want);

    -- Account slots in time order, from p_lead on (the caller's time to get
    -- ready to send) and within the horizon.
    WHILE coalesce(array_length(slots, 1), 0) < avail LOOP
        t := greatest(p_now + p_lead, a_tat - a_tau);
        EXIT WHEN t > p_now + p_horizon;
        slots := slots || t;
        a_tat := a_tat + a_iv;
    END LOOP;
    f_tat := f_tat + coalesce(array_length(slots, 1), 0) * f_iv;

    next_at := greatest(p_now, f_tat - f_burst * f_iv + f_iv, a_tat - a_tau - p_horizon);
    queue_at := greatest(f_queue, next_at);
    -- The ones that waited before come first in p_want, the new ones last.
    granted := coalesce(array_length(slots, 1), 0);
    old_denied := greatest(p_want - p_fresh - granted, 0);
    new_denied := p_want - granted - old_denied;
    -- Turns are spaced at the most the flow could ever get (its cap, or the
    -- whole account), not at its share now: a share grows when other flows
    -- finish, and messages spaced at the old share would come back too
    -- slowly to use it. A message back before its slot is free asks again
    -- and gets a later turn.
    q_iv := make_interval(secs => 1.0 / least(coalesce(p_cap, p_rate), p_rate));
    f_queue := queue_at + new_denied * q_iv;
    IF old_denied > 0 THEN
        f_waiting := greatest(f_waiting, next_at + (old_denied - 1) * q_iv);
    END IF;
    IF new_denied > 0 THEN
        f_waiting := greatest(f_waiting, queue_at + (new_denied - 1) * q_iv);
    END IF;

    UPDATE rate_limits SET tat = a_tat WHERE key = acc_key;
    UPDATE rate_flows SET cap = p_cap, tat = f_tat, queue_tat = f_queue, waiting = f_waiting,
                          last_ask = greatest(last_ask, p_now), share = nudge_rate_reserve.share
     WHERE account = p_account AND flow = p_flow;
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'nudge_worker') THEN
        GRANT SELECT, INSERT, UPDATE ON rate_flows TO nudge_worker;
    END IF;
END $$;

-- The dispatcher claims due reminders round robin across tenants (ClaimDue),
-- so one tenant's backlog is not queued ahead of everyone else's reminders
-- that fall due at the same time. This index finds each tenant's due rows.
CREATE INDEX reminders_pending_tenant ON reminders (tenant, due_at, id) WHERE state = 'pending';
