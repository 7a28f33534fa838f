-- Schema version 46: a floor per writer the promoter waits for (issue 18;
-- docs/benchmarks.md, "The promoter under a long web transaction" and "The
-- promoter's re-scan, bounded by a floor per waited writer").
--
-- Until here every sweep scanned [final_until, its end): while a web
-- transaction that wrote a lazy reminder stayed open, final_until stayed
-- where it was when it began, and every dispatcher run re-read every lazy
-- reminder due since (172k rows, 0.6 s of backend CPU a run at 1M after
-- 6 h). A writer's reminders are due past the provisional end read before
-- it was first seen (it took its lock on reminders after that read, so
-- lazy intake put them at least the horizon past its clock). So a sweep of
-- this release starts at the smallest floor among the writers it waited
-- for that are gone, at the last sweep's end when none is gone: a long
-- transaction costs nothing until it ends, then one re-scan from its
-- floor.
--
-- floor_wait and floor_at are parallel: the writers (virtual ids) read at
-- the start of the last sweep this release started, and each one's floor.
-- A sweep trusts them only when floor_wait is the same set as prov_wait
-- (the writers the last complete sweep waited for): a sweep started by the
-- previous release (which knows nothing of these columns and leaves them
-- as they were), or a state moved by hand, leaves them unequal or NULL,
-- and the next sweep starts at final_until, as before. final_until itself
-- moves as before.
--
-- A regular migration: the previous release's dispatcher reads and writes
-- only the columns it knows (its PromoterRead selects them by name, its
-- PromoterSave sets them by name) and runs unchanged on this schema. The
-- ALTER takes nudge_promoter's ACCESS EXCLUSIVE lock for a catalogue change
-- (nullable columns without a default: no row is rewritten), so it waits
-- for a promoter pass in progress (milliseconds) and the next pass waits
-- for it; nothing else is locked. On an install at 43 it waits behind the
-- after-rollout step 44 (migrations apply in order) while this release's
-- dispatcher already runs: its PromoterRead reads these columns through
-- the row's jsonb and, without them, starts every sweep at final_until.
ALTER TABLE nudge_promoter ADD COLUMN IF NOT EXISTS floor_wait text[],
    ADD COLUMN IF NOT EXISTS floor_at timestamptz[];
COMMENT ON COLUMN nudge_promoter.floor_wait IS
    'The writers on reminders (virtual ids) read at the start of the last sweep this release started '
    '(schema 46; NULL: none yet, or reset by hand): the next sweep trusts floor_at only when this is the '
    'same set as prov_wait, else it starts at final_until.';
COMMENT ON COLUMN nudge_promoter.floor_at IS
    'Parallel to floor_wait: each writer''s floor, the provisional end read before it was first seen (or '
    'final_until when not known): every lazy reminder it writes is due at or past it. A sweep starts at the '
    'smallest floor among prov_wait''s writers that are gone, or at prov_until when none is.';
