-- Nudge schema, version 15: the dispatcher's metrics reach Prometheus without
-- a Pushgateway (issue 17).
--
-- The dispatcher is a CronJob, gone before any scrape. Each run records the
-- hop latencies it observed (due → claim, claim → enqueue) in its
-- dispatch_runs row, as histogram counts by hop and channel:
-- {"due_to_claim/email": {"count": 3, "sum": 1.2, "buckets": [...]}} with
-- cumulative bucket counts at metrics.LatencyBuckets. The reconciler reads the
-- rows added since its last scrape (by primary key) and exports them with the
-- runs' success times (metrics.DispatchRunCollector). Runs recorded by an
-- earlier dispatcher get '{}'.
ALTER TABLE dispatch_runs ADD COLUMN hops jsonb NOT NULL DEFAULT '{}'::jsonb;

GRANT INSERT (hops) ON dispatch_runs TO nudge_dispatcher;
