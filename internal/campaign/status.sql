-- What a campaign's status report reads (status.go): the campaign row, its
-- last checkpoint, and its reminders by state. Each is bounded by the one
-- campaign: the primary keys of campaigns and campaign_slices, and the
-- campaign-keys index of reminders (schema 0026), never another tenant's
-- reminders nor the tenant's other ones.

-- name: Report
-- The slice size is the campaign's own (NULL from schema 25 on: the
-- planner's configured size); the late slices are counted in its own, or
-- else in its largest slice so far, or else the default 200.
SELECT c.id, c.tenant, c.name, c.source, c.channel, c.state, c.slice_size,
       coalesce(c.slice_size, (SELECT max(s.rows_read) FROM campaign_slices s WHERE s.campaign_id = c.id), 200),
       extract(epoch FROM c.lease)::float8, c.planned, c.bad, c.fence, c.unplanned, c.deadline,
       c.created_at, c.updated_at, c.ended_at,
       (SELECT s.at FROM campaign_slices s WHERE s.campaign_id = c.id ORDER BY s.slice DESC LIMIT 1)
  FROM campaigns c
 WHERE c.id = $1;

-- name: Deliveries
-- $2 and $3 bound the keys campaign:<id>: bytewise (':' + 1 is ';'); the
-- LIKE repeats the index's predicate so that the index serves the range.
SELECT state, count(*)
  FROM reminders
 WHERE tenant = $1 AND key LIKE 'campaign:%' AND key ~>=~ $2 AND key ~<~ $3
 GROUP BY state;

-- name: RemainingEstimate
-- The remainder without reading the source: its row count as PostgreSQL
-- last estimated it (VACUUM, ANALYZE; NULL for a view, or before either)
-- less the rows read. For readers not granted the source (operators).
SELECT CASE WHEN cl.relkind IN ('r', 'm') AND cl.reltuples >= 0
            THEN greatest(cl.reltuples::bigint - c.planned - c.bad, 0) END
  FROM campaigns c
  JOIN campaign_sources s ON s.name = c.source
  JOIN pg_catalog.pg_class cl ON cl.oid = s.relation
 WHERE c.id = $1;
