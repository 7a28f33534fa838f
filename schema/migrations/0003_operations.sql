-- Nudge schema, version 3: what operators, the retention pass and the
-- database-derived metrics need. Independent of version 2 (roles): it only
-- adds a column, indexes and two tables; privileges on them are granted by
-- whoever manages the roles.

-- Set when the retention pass removed a terminal reminder's payload (data
-- emptied, recipient masked, its delivery attempts deleted). A purged reminder
-- can never be replayed: there is nothing left to send.
ALTER TABLE reminders ADD COLUMN purged_at timestamptz;

-- The retention pass walks terminal rows from the oldest end: one small index
-- over rows whose payload is still there (purging removes a row from it), one
-- over every terminal row (deleting removes it). finished_at is set by every
-- terminal transition; updated_at stands in should one ever miss it.
CREATE INDEX reminders_terminal_unpurged ON reminders ((coalesce(finished_at, updated_at)))
    WHERE purged_at IS NULL AND state IN ('delivered', 'failed', 'expired', 'canceled');
CREATE INDEX reminders_terminal ON reminders ((coalesce(finished_at, updated_at)))
    WHERE state IN ('delivered', 'failed', 'expired', 'canceled');

-- Expired reminders by the time they expired: "deadline misses in the last
-- hour" for stats and the metrics collector, without reading delivered rows.
CREATE INDEX reminders_expired ON reminders (finished_at) WHERE state = 'expired';

-- Failed and quarantined reminders by due time: what `nudgectl replay` selects
-- by window. They are a small share of all reminders, so the index stays small.
CREATE INDEX reminders_replayable ON reminders (due_at) WHERE state IN ('failed', 'quarantined');

-- Quarantine events by time: "dead letters in the last hour and day". A
-- quarantine is rare, so the index is tiny and costs nothing on the hot path.
CREATE INDEX reminder_events_quarantined ON reminder_events (at) WHERE to_state = 'quarantined';

-- One row per dispatcher run that finished: the dispatcher's heartbeat and the
-- source of "is the dispatcher advancing its cutoff". A run that dies writes
-- nothing, which is exactly what the cutoff lag should show.
CREATE TABLE dispatch_runs (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    actor         text        NOT NULL,
    cutoff        timestamptz NOT NULL,
    finished_at   timestamptz NOT NULL,
    claimed       integer     NOT NULL DEFAULT 0,
    enqueued      integer     NOT NULL DEFAULT 0,
    expired       integer     NOT NULL DEFAULT 0,
    released      integer     NOT NULL DEFAULT 0,
    -- The run stopped before its budget ran out with due work possibly left.
    out_of_budget boolean     NOT NULL DEFAULT false,
    error         text
);
CREATE INDEX dispatch_runs_finished ON dispatch_runs (finished_at);

-- Operator decisions that have no reminder row to carry an event: a dead
-- letter that names no reminder (or one that no longer exists) dropped from a
-- dead-letter queue, and every dead-letter message an operator acknowledged,
-- with the message's own explanation. Decisions about reminders are in
-- reminder_events as well.
CREATE TABLE operator_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL,
    actor       text        NOT NULL,
    -- 'dlq.replay', 'dlq.expire', 'dlq.drop'
    action      text        NOT NULL,
    channel     text,
    reminder_id bigint,
    message_id  text,
    reason      text        NOT NULL,
    -- What the message said: its x-nudge-* headers, and the reminder state.
    detail      jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX operator_audit_at ON operator_audit (at);
