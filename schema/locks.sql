-- Statements about the locks a migration waits for (apply.go).

-- name: LockHolders
-- The sessions other than this one whose transactions, open for longer than
-- @older, hold a lock on a table of the current schema: what a migration's
-- lock request that timed out after @older was waiting behind (an ACCESS
-- EXCLUSIVE request conflicts with every lock, ROW EXCLUSIVE and ACCESS
-- SHARE included). Oldest transaction first. xact_start and state are NULL
-- for another login's sessions unless this one may read them
-- (pg_read_all_stats): such a session is listed with no age.
SELECT a.pid,
       string_agg(DISTINCT c.relname::text, ', ' ORDER BY c.relname::text) AS tables,
       coalesce(a.state, '') AS state,
       coalesce(extract(epoch FROM now() - a.xact_start), -1)::float8 AS open_seconds
  FROM pg_locks l
  JOIN pg_class c ON c.oid = l.relation
  JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'relation' AND l.granted
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p')
   AND l.pid <> pg_backend_pid()
   AND (a.xact_start IS NULL OR a.xact_start < now() - @older::interval)
 GROUP BY a.pid, a.state, a.xact_start
 ORDER BY a.xact_start NULLS LAST, a.pid
 LIMIT 5
