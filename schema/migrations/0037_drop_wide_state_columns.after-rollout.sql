-- Schema version 37, after the rollout: drop the stale state columns of
-- reminders (issue 18, the contract step of the narrow-state layout).
--
-- RUN ONLY WHEN NO BINARY OF RELEASE 1 OF THE LAYOUT (2f23578) OR OLDER
-- RUNS (`nudgectl migrate --after-rollout`, docs/deploy.md). Since version
-- 35 nothing reads these columns and nothing copies reminder_state into
-- them; intake leaves them at their defaults. Release 1's intake and
-- campaign statements still name none of them, but an older binary reads
-- and writes them, and release 1's tests' fixtures do. A plain `nudgectl
-- migrate` stops before this file and reports it as waiting.
--
-- What goes: the delivery state that lives on reminder_state since version
-- 32, with its CHECK (reminders_state_check): state, fence, lease_until,
-- attempts, republishes, next_attempt_at, enqueued_at, last_error, reason,
-- updated_at, finished_at, purged_at, dispatch_batch, the happy path's
-- slots (claimed_at/_fence/_by, started_at/_fence/_by, delivered_by), and
-- requested_due_at: the due time asked for when the dispatcher moved due_at
-- to a window's opening, which reminder_state keeps; intake never wrote it
-- on reminders (there due_at is what was asked for), so it is state too. No
-- index, view, policy, trigger or function of this release names them
-- (schema/contract_test.go checks the catalogue after migrating).
--
-- What stays on reminders: who and what (tenant, key, channel, recipient,
-- template, data, idempotency_key, created_at) and the intent as first
-- recorded (due_at, deadline, tz, window_open/close/days), written once at
-- intake: a later slice may promote reminders into a due-ordered store from
-- them. The current due time and window are reminder_state's.
--
-- Dropping a column is a catalog change: it takes a short ACCESS EXCLUSIVE
-- lock on reminders (waiting for the running transactions on it, holding
-- the fleet's next ones for milliseconds) and rewrites no row. The space
-- the dropped values hold returns as rows are rewritten (intake's update,
-- the payload purge) or deleted (retention); new rows are narrower at once.

ALTER TABLE reminders
    DROP CONSTRAINT IF EXISTS reminders_state_check,
    DROP COLUMN IF EXISTS state,
    DROP COLUMN IF EXISTS fence,
    DROP COLUMN IF EXISTS lease_until,
    DROP COLUMN IF EXISTS attempts,
    DROP COLUMN IF EXISTS republishes,
    DROP COLUMN IF EXISTS next_attempt_at,
    DROP COLUMN IF EXISTS enqueued_at,
    DROP COLUMN IF EXISTS last_error,
    DROP COLUMN IF EXISTS reason,
    DROP COLUMN IF EXISTS updated_at,
    DROP COLUMN IF EXISTS finished_at,
    DROP COLUMN IF EXISTS purged_at,
    DROP COLUMN IF EXISTS dispatch_batch,
    DROP COLUMN IF EXISTS claimed_at,
    DROP COLUMN IF EXISTS claimed_fence,
    DROP COLUMN IF EXISTS claimed_by,
    DROP COLUMN IF EXISTS started_at,
    DROP COLUMN IF EXISTS started_fence,
    DROP COLUMN IF EXISTS started_by,
    DROP COLUMN IF EXISTS delivered_by,
    DROP COLUMN IF EXISTS requested_due_at;

-- The intent columns say so in the catalogue (\d+ reminders).
COMMENT ON COLUMN reminders.due_at IS
    'the intent as first recorded; the current due time and window are reminder_state''s';
COMMENT ON COLUMN reminders.deadline IS
    'the intent as first recorded; the current deadline is reminder_state''s';
COMMENT ON COLUMN reminders.tz IS
    'the intent as first recorded; the current due time and window are reminder_state''s';
COMMENT ON COLUMN reminders.window_open IS
    'the intent as first recorded; the current due time and window are reminder_state''s';
COMMENT ON COLUMN reminders.window_close IS
    'the intent as first recorded; the current due time and window are reminder_state''s';
COMMENT ON COLUMN reminders.window_days IS
    'the intent as first recorded; the current due time and window are reminder_state''s';
