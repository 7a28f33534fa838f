-- The previous release's promoter read (internal/upgrade's OldRelease,
-- e1180f7: its PromoterRead, copied unchanged), for tests that run its
-- passes between this release's on schema 46; its save is queries.sql's
-- PromoterSaveSchema45. It reads and writes only the columns it knows, and
-- every sweep it starts scans from final_until.

-- name: PromoterReadSchema45
SELECT p.final_until, p.prov_until, p.sweep_until, p.sweep_wait, p.sweep_prev_done, p.cursor_due, p.cursor_id,
       statement_timestamp()
       + least(@ahead::interval, coalesce((SELECT l.horizon FROM nudge_lazy_intake l), @ahead::interval)),
       coalesce((SELECT array_agg(DISTINCT w.virtualtransaction)
                   FROM pg_locks w
                  WHERE w.locktype = 'relation' AND w.relation = 'reminders'::regclass
                    AND w.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                    AND w.mode IN ('RowExclusiveLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
                    AND w.granted AND w.pid IS DISTINCT FROM pg_backend_pid()), '{}'),
       NOT EXISTS (SELECT 1 FROM pg_locks v
                    WHERE v.locktype = 'virtualxid' AND v.virtualxid = ANY(p.prov_wait))
  FROM nudge_promoter p;
