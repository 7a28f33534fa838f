#!/usr/bin/env bash
# Builds the fixture of docs/benchmarks.md, "Operator statements after layout
# A": schema opsperf_old migrated to 31 by the nudgectl of 0dbb7c8 (before
# layout A), schema opsperf_new migrated after the rollout (35, 36) by this
# tree's, both filled with the same 400k reminders (fill*.sql) and then
# scattered (scatter.sql). Run from the repository root; ~2 minutes.
# OPSPERF=name builds name_old and name_new instead (bench.sh reads opsperf_*).
set -euo pipefail
S=${OPSPERF:-opsperf}
D=bench/opstatements
P="psql -h 127.0.0.1 -U postgres test -v ON_ERROR_STOP=1 -q"
URL='postgres://postgres@127.0.0.1:5432/test?search_path='
tmp=$(mktemp -d)
git archive 0dbb7c8 | tar -x -C "$tmp"
(cd "$tmp" && go build -o nudgectl ./cmd/nudgectl)
go build -o "$tmp/nudgectl-new" ./cmd/nudgectl
$P -c 'SET client_min_messages = warning' -c "DROP SCHEMA IF EXISTS ${S}_old CASCADE" -c "DROP SCHEMA IF EXISTS ${S}_new CASCADE" \
   -c "CREATE SCHEMA ${S}_old" -c "CREATE SCHEMA ${S}_new"
"$tmp/nudgectl" migrate --database-url "${URL}${S}_old" --log-format json >/dev/null 2>&1
"$tmp/nudgectl-new" migrate --after-rollout --database-url "${URL}${S}_new" --log-format json >/dev/null 2>&1
(echo "\\set schema ${S}_old"; cat $D/fill.sql $D/fill_old.sql) | $P -f - >/dev/null
(echo "\\set schema ${S}_new"; cat $D/fill.sql $D/fill_new.sql) | $P -f - >/dev/null
$P -v schema=${S}_old -v tbl=reminders -f $D/scatter.sql
$P -v schema=${S}_new -v tbl=reminder_state -f $D/scatter.sql
# A transaction of another session open across the VACUUMs keeps the dead
# versions (and their index entries): the figures then differ. Say so.
dead=$(psql -h 127.0.0.1 -U postgres test -At -c "SELECT sum(n_dead_tup) FROM pg_stat_user_tables
  WHERE (schemaname, relname) IN (('${S}_old', 'reminders'), ('${S}_new', 'reminder_state'))")
[ "${dead:-0}" -eq 0 ] || echo "warning: $dead dead row versions left (an older transaction held VACUUM back); run setup again when none runs" >&2
echo "fixture ready; the A/B rounds: bash $D/bench.sh"
rm -rf "$tmp"
