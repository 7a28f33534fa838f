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
       (SELECT s.at FROM campaign_slices s WHERE s.campaign_id = c.id ORDER BY s.slice DESC LIMIT 1),
       c.shadow
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

-- name: SliceTime
-- The measured time of this campaign's slices (took_ms, schema 25): how
-- many were measured, their median and 95th percentile.
SELECT count(took_ms), percentile_cont(0.5) WITHIN GROUP (ORDER BY took_ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY took_ms)
  FROM campaign_slices
 WHERE campaign_id = $1;

-- name: Counterpart
-- The campaign a shadow run is compared with, or a real run with: the
-- latest of the other kind over the same tenant, source and slice size
-- (its slices are then the same audience rows).
SELECT o.id
  FROM campaigns c
  JOIN campaigns o ON o.tenant = c.tenant AND o.source = c.source AND o.shadow <> c.shadow
                  AND o.slice_size IS NOT DISTINCT FROM c.slice_size
 WHERE c.id = $1
 ORDER BY o.id DESC
 LIMIT 1;

-- name: IsShadow
SELECT shadow FROM campaigns WHERE id = $1;

-- name: CompareTotals
-- Over every slice of either campaign ($2 NULL: the shadow run's alone).
SELECT count(*), count(*) FILTER (WHERE NOT same),
       coalesce(sum(shadow_rows), 0), coalesce(sum(shadow_intents), 0), coalesce(sum(shadow_bad), 0),
       coalesce(sum(real_rows), 0), coalesce(sum(real_intents), 0), coalesce(sum(real_bad), 0)
  FROM nudge_campaign_shadow_compare($1, $2);

-- name: CompareSlices
-- The first $3 slices, in order.
SELECT slice, shadow_rows, shadow_intents, shadow_bad, real_rows, real_intents, real_bad, same
  FROM nudge_campaign_shadow_compare($1, $2)
 LIMIT $3;
