#!/usr/bin/env bash
# A B B A rounds (two of them) over the fixture of setup.sh: each line is one
# EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) run: execution time and shared
# buffers (hit + read). v31 runs on opsperf_old; v34/v36 and before/after on
# opsperf_new, swapping nudge_campaign_status's body (34's, 36's) and the
# replayable index (reminder_state_replayable of 32, _tenant of 36) between
# runs. Run from the repository root.
set -uo pipefail
D=bench/opstatements
P="psql -h 127.0.0.1 -U postgres test -q"
tmp=$(mktemp -d)
# nudge_campaign_status's body of 34 and of 36, as their migrations write them.
for v in 34 36; do
  { echo 'SET search_path = opsperf_new;'
    sed -n '/^CREATE OR REPLACE FUNCTION nudge_campaign_status/,/^END \$\$;/p' schema/migrations/00${v}_*.sql
    echo 'ALTER FUNCTION nudge_campaign_status(text, bigint) SET search_path = opsperf_new, pg_temp;'
  } >"$tmp/status_v$v.sql"
done
# Replay's candidates on each layout: failed and quarantined, or every replayable state.
for t in reminders:_v31 reminder_state:; do
  sed "s/TABLE/${t%%:*}/; s/STATES/failed,quarantined/" $D/replay.sql >"$tmp/replay_failed${t#*:}.sql"
  sed "s/TABLE/${t%%:*}/; s/STATES/failed,quarantined,leased,enqueued,retrying/" $D/replay.sql >"$tmp/replay_all${t#*:}.sql"
done
fn() { $P -f "$tmp/status_v$1.sql" >/dev/null; }
idx() {
  if [ "$1" = before ]; then
    $P -c "SET search_path = opsperf_new" \
       -c "CREATE INDEX IF NOT EXISTS reminder_state_replayable ON reminder_state (due_at) WHERE state IN ('failed', 'quarantined')" \
       -c "DROP INDEX IF EXISTS reminder_state_replayable_tenant" -c "ANALYZE reminder_state" >/dev/null 2>&1
  else
    $P -c "SET search_path = opsperf_new" \
       -c "CREATE INDEX IF NOT EXISTS reminder_state_replayable_tenant ON reminder_state (due_at, tenant) WHERE state IN ('failed', 'quarantined')" \
       -c "DROP INDEX IF EXISTS reminder_state_replayable" -c "ANALYZE reminder_state" >/dev/null 2>&1
  fi
}
ex() { bash $D/ex.sh "$@"; }
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in 1 2; do
  for v in 34 36 36 34; do fn $v; for i in 1 2; do echo "status v$v: $(ex opsperf_new $D/status.sql)"; done; done
  for i in 1 2; do echo "status v31: $(ex opsperf_old $D/status.sql)"; done
  for v in 34 36 36 34; do for i in 1 2; do echo "deliveries v$v: $(ex opsperf_new $D/deliveries_v$v.sql)"; done; done
  for i in 1 2; do echo "deliveries v31: $(ex opsperf_old $D/deliveries_v31.sql)"; done
  for v in before after after before; do
    idx $v
    for q in failed all; do for i in 1 2; do echo "replay-$q $v: $(ex opsperf_new "$tmp/replay_$q.sql")"; done; done
  done
  for q in failed all; do for i in 1 2; do echo "replay-$q v31: $(ex opsperf_old "$tmp/replay_${q}_v31.sql")"; done; done
done
idx after
fn 36
rm -rf "$tmp"
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
