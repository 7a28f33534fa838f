-- Every statement the planner runs against the campaign tables (schema
-- migration 0020). A slice is one transaction: Lock, Timeouts, Audience,
-- the bulk intake statement (pkg/intake), BadRows, Checkpoint, Advance.
-- Time comes from the caller's clock ($n "now"), never from now().

-- name: Lock
-- Locks the campaign for one slice: the row lock is the planning lease (it
-- ends with the transaction, or with the session of a killed planner), the
-- fence says which slice the campaign is at.
SELECT id, tenant, channel, template, due_at, days_before, deadline, slice_size,
       extract(epoch FROM lease)::float8, state, cursor, fence, continued, updated_at,
       due_local, extract(epoch FROM at_local)::integer, default_zone, shadow, shadow_keys,
       nudge_campaign_enabled(tenant)
  FROM campaigns
 WHERE id = $1
   FOR UPDATE;

-- name: Timeouts
-- Bounds the rest of the slice's transaction by the campaign's lease: a
-- planner stalled past it loses its session, and with it every write of the
-- slice, before another may plan.
SELECT set_config('statement_timeout', $1, true),
       set_config('idle_in_transaction_session_timeout', $1, true);

-- name: Audience
SELECT a_key, a_recipient, a_data, a_date, a_day, a_zone FROM nudge_campaign_audience($1, $2, $3);

-- name: Remaining
SELECT nudge_campaign_remaining($1, $2);

-- name: BadRows
INSERT INTO campaign_bad_rows (campaign_id, audience_key, reason, at)
SELECT $1, k, r, $4 FROM unnest($2::text[], $3::text[]) AS u(k, r)
    ON CONFLICT (campaign_id, audience_key) DO NOTHING;

-- name: Checkpoint
INSERT INTO campaign_slices (campaign_id, slice, cursor_from, cursor_to, rows_read, intents, bad_rows, planner, at,
                             took_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: ShadowKeys
-- The audience keys a shadow slice would have scheduled.
INSERT INTO campaign_shadow_keys (campaign_id, audience_key, slice)
SELECT $1, k, $3 FROM unnest($2::text[]) AS u(k)
    ON CONFLICT (campaign_id, audience_key) DO NOTHING;

-- name: Advance
-- Stores the next cursor and the counts, fenced: only the holder of fence $2.
UPDATE campaigns
   SET cursor = $3, fence = fence + 1, planned = planned + $4, bad = bad + $5,
       state = CASE WHEN $6::boolean THEN 'done' ELSE state END,
       ended_at = CASE WHEN $6::boolean THEN $7::timestamptz END,
       updated_at = $7::timestamptz
 WHERE id = $1 AND fence = $2 AND state = 'planning';

-- name: EndLate
UPDATE campaigns
   SET state = 'late', unplanned = $3, fence = fence + 1, ended_at = $4, updated_at = $4
 WHERE id = $1 AND fence = $2 AND state = 'planning';

-- name: Continued
-- Records that the command for fence $2 was published (confirmed).
UPDATE campaigns SET continued = $2 WHERE id = $1 AND continued < $2;

-- name: Runnable
-- The campaigns the planner's cron publishes a command for: those planning,
-- of tenants in the campaign cohort.
SELECT id, tenant, deadline, fence FROM campaigns
 WHERE state = 'planning' AND nudge_campaign_enabled(tenant)
 ORDER BY id;

-- name: Create
SELECT id, created FROM nudge_campaign_create($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
                                              $11, $12, $13, $14, $15, $16);

-- name: Set
SELECT nudge_campaign_set($1, $2, $3);

-- name: Status
SELECT c.id, c.tenant, c.name, c.source, c.state, c.planned, c.bad,
       (SELECT count(*) FROM campaign_slices s WHERE s.campaign_id = c.id), c.unplanned, c.deadline,
       (SELECT max(s.at) FROM campaign_slices s WHERE s.campaign_id = c.id)
  FROM campaigns c
 WHERE c.id = $1;

-- name: List
SELECT c.id, c.tenant, c.name, c.source, c.state, c.planned, c.bad,
       (SELECT count(*) FROM campaign_slices s WHERE s.campaign_id = c.id), c.unplanned, c.deadline,
       (SELECT max(s.at) FROM campaign_slices s WHERE s.campaign_id = c.id)
  FROM campaigns c
 WHERE ($1::text IS NULL OR c.tenant = $1)
 ORDER BY c.id
 LIMIT $2;

-- name: RemainingOf
-- With the caller's rights: who may not read the audience gets an error.
SELECT CASE WHEN state = 'planning' OR state = 'paused' THEN nudge_campaign_remaining(id, cursor) ELSE 0 END
  FROM campaigns
 WHERE id = $1;

-- name: SourceSize
-- The admission's audience count, with the caller's rights.
SELECT nudge_campaign_source_size($1);

-- name: RowTime
-- The planning time per audience row of this installation (schema 29: the
-- web tier's admission reads the same function).
SELECT n, per_row_ms FROM nudge_campaign_row_time($1, $2);

-- name: Cohort
SELECT tenant FROM campaign_cohort ORDER BY tenant;

-- name: CohortSet
-- $1: the whole cohort.
WITH gone AS (DELETE FROM campaign_cohort WHERE tenant <> ALL ($1::text[]))
INSERT INTO campaign_cohort (tenant, added_by) SELECT t, $2 FROM unnest($1::text[]) AS u(t)
    ON CONFLICT (tenant) DO NOTHING;

-- name: CohortAdd
INSERT INTO campaign_cohort (tenant, added_by) SELECT t, $2 FROM unnest($1::text[]) AS u(t)
    ON CONFLICT (tenant) DO NOTHING;

-- name: CohortRemove
-- $2 (who) is unused: a removal leaves no row.
DELETE FROM campaign_cohort WHERE tenant = ANY ($1::text[]) AND $2::text IS NOT NULL;

-- name: CompareShadow
SELECT slice, shadow_rows, shadow_intents, shadow_bad, real_rows, real_intents, real_bad, same
  FROM nudge_campaign_shadow_compare($1, $2);

-- name: StageBegin
SELECT nudge_campaign_stage_begin($1, $2, $3);

-- name: StageEnd
SELECT rows, bad FROM nudge_campaign_stage_end($1, $2, $3, $4, $5, $6);

-- name: Staged
SELECT rows, bad FROM campaign_stages WHERE source = $1;

-- name: StageErrors
SELECT line, coalesce(key, ''), field, reason FROM campaign_stage_errors WHERE source = $1 ORDER BY line LIMIT $2;

-- name: Find
SELECT id FROM campaigns WHERE tenant = $1 AND name = $2;

-- What a campaign's status report reads (status.go): the campaign row, its
-- last checkpoint, and its reminders by state. Each is bounded by the one
-- campaign: the primary keys of campaigns and campaign_slices, and the
-- keys index of reminders (schema 0034; then the state rows by ranges of
-- their primary key), never another tenant's reminders nor the tenant's
-- other ones.

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
-- $2 and $3 bound the keys campaign:<id>: bytewise (':' + 1 is ';'), over
-- reminders_keys. The keys are the wide row's, each one's state its state
-- row's (reminder_state, schema 32). The planner writes a campaign's
-- reminders a slice at a time, so their ids come in runs of consecutive
-- values (id - row_number() is constant along a run): each run is read from
-- reminder_state as one range of its primary key, not one probe per
-- reminder (a range holds only its run's ids). A run [lo, hi] holds
-- hi - lo + 1 of the campaign's reminders: those its range of reminder_state
-- lacks have no state row yet (due far ahead: the promoter inserts it) and
-- are pending. As nudge_campaign_status since schema 39.
WITH runs AS MATERIALIZED (
    SELECT min(k.id) AS lo, max(k.id) AS hi
      FROM (SELECT r.id, r.id - row_number() OVER (ORDER BY r.id) AS run
              FROM reminders r
             WHERE r.tenant = $1 AND r.key LIKE 'campaign:%' AND r.key ~>=~ $2 AND r.key ~<~ $3) k
     GROUP BY k.run
), promoted AS MATERIALIZED (
    SELECT s.state, count(*) AS n
      FROM runs
      JOIN LATERAL (SELECT s.state FROM reminder_state s WHERE s.id BETWEEN runs.lo AND runs.hi) s ON true
     GROUP BY s.state
)
SELECT t.state, sum(t.n)::bigint
  FROM (SELECT p.state, p.n FROM promoted p
        UNION ALL
        SELECT 'pending', (SELECT coalesce(sum(runs.hi - runs.lo + 1), 0) FROM runs)
                          - (SELECT coalesce(sum(p.n), 0) FROM promoted p)) t
 GROUP BY t.state
HAVING sum(t.n) > 0;

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

-- name: RatesClear
-- Replaces the stored admission budget (nudgectl campaign rates), with RatesBudget and RatesInsert in one transaction.
WITH gone AS (DELETE FROM campaign_admission_rates)
DELETE FROM campaign_admission_budget;

-- name: RatesBudget
INSERT INTO campaign_admission_budget (limits_from, limits_version, retry_ns, retry_from, slice_size, stored_at, stored_by)
VALUES ($1, $2, $3, $4, $5, $6, $7);

-- name: RatesInsert
INSERT INTO campaign_admission_rates (channel, tenant, rate, rate_from)
SELECT * FROM unnest($1::text[], $2::text[], $3::float8[], $4::text[]);

-- name: RatesBudgetRead
SELECT limits_from, limits_version, retry_ns, retry_from, slice_size, stored_at, stored_by FROM campaign_admission_budget;

-- name: RatesRead
SELECT channel, tenant, rate, rate_from FROM campaign_admission_rates ORDER BY channel, tenant;

-- name: AdmitSQL
-- The web tier's admission rule (schema 29), for the test that runs it beside Admit.
SELECT nudge_campaign_admit($1::jsonb);

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
