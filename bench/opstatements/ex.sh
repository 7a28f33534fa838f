# usage: ex.sh SCHEMA FILE [SETTING]: one EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) of FILE, printed as
# "<execution ms> ms  buffers=<shared hit + read> (hit H read R)" (the top node's counts).
s=$1; f=$2
out=$(psql -h 127.0.0.1 -U postgres test -At -c "set search_path=$s; $3; explain (analyze, buffers, timing off, format json) $(cat $f)" | grep -v '^SET')
python3 - "$out" <<'PY'
import json,sys
j=json.loads(sys.argv[1])[0]
p=j["Plan"]
print("%.1f ms  buffers=%d (hit %d read %d)" % (j["Execution Time"], p.get("Shared Hit Blocks",0)+p.get("Shared Read Blocks",0), p.get("Shared Hit Blocks",0), p.get("Shared Read Blocks",0)))
PY
