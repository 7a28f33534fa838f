#!/usr/bin/env python3
"""What schema 39 (reads and writes without a state row) costs a reminder
that has its state row, on the fixture of setup.sh (every reminder promoted).

usage: python3 bench/opstatements/unpromoted.py [SCHEMA [BASE]]

SCHEMA (default opsperf_new) is setup.sh's schema of this tree; BASE (default
032cd5b, the tree before 39) gives the "before" statements and functions.
Two rounds of A B B A (before, after, after, before), two runs each: every
line is one EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) of one statement, its
execution time and the top node's shared buffers (hit + read). Before each
variant the functions 39 replaces are re-created from BASE's migrations or
this tree's 0039; the Go statements are BASE's or this tree's text of their
.sql file, prepared with typed parameters. Writes run in a transaction that
is rolled back. Run from the repository root.
"""
import json
import re
import subprocess
import sys

SCHEMA = sys.argv[1] if len(sys.argv) > 1 else "opsperf_new"
BASE = sys.argv[2] if len(sys.argv) > 2 else "032cd5b"
PSQL = ["psql", "-h", "127.0.0.1", "-U", "postgres", "test", "-At", "-v", "ON_ERROR_STOP=1", "-q"]

FUNCS = ["nudge_cancel_unchecked", "nudge_reschedule_unchecked", "nudge_reschedule_window",
         "nudge_reschedule_to", "nudge_update", "nudge_cancel_prefix", "nudge_campaign_status"]


def psql(sql):
    return subprocess.run(PSQL, input=sql, capture_output=True, text=True, check=True).stdout


def source(path, rev):
    if rev is None:
        with open(path) as f:
            return f.read()
    return subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout


def functions(rev):
    """The CREATE OR REPLACE of FUNCS, the last one of each in the migrations
    up to 36 (BASE) or 0039 (this tree)."""
    files = (["schema/migrations/0034_state_functions.sql", "schema/migrations/0036_operator_statements.sql"]
             if rev else ["schema/migrations/0039_unpromoted_reads_writes.sql"])
    out = {}
    for f in files:
        text = source(f, rev)
        for m in re.finditer(r"^CREATE OR REPLACE FUNCTION (\w+)\((?:(?!^CREATE OR REPLACE FUNCTION).)*?^END \$\$;",
                             text, re.S | re.M):
            out[m.group(1)] = m.group(0)
    assert set(FUNCS) <= set(out), set(FUNCS) - set(out)
    pins = "".join(f"DO $$ BEGIN EXECUTE format('ALTER FUNCTION %s SET search_path = {SCHEMA}, pg_temp', "
                   f"(SELECT p.oid::regprocedure FROM pg_proc p WHERE p.proname = '{f}' "
                   f"AND p.pronamespace = '{SCHEMA}'::regnamespace AND p.prosecdef)); END $$;\n"
                   for f in FUNCS if f not in ("nudge_cancel_unchecked", "nudge_reschedule_unchecked"))
    return f"SET search_path = {SCHEMA};\n" + "\n".join(out[f] for f in FUNCS) + "\n" + pins


def named(path, name, rev):
    text = source(path, rev)
    m = re.search(r"^-- name: " + name + r"\n(.*?)(?=^-- name: |\Z)", text, re.S | re.M)
    body = "\n".join(l for l in m.group(1).splitlines() if not l.lstrip().startswith("--"))
    return body.strip().rstrip(";")


def dollars(sql, params):
    """@name -> $n in the order of params."""
    for i, p in enumerate(params, 1):
        sql = re.sub(r"@" + p + r"\b", f"${i}", sql)
    assert "@" not in re.sub(r"'[^']*'", "", sql), sql
    return sql


NOW = "2026-12-02 00:00:00+00"
key = psql(f"""SET search_path = {SCHEMA};
SELECT r.key FROM reminders r JOIN reminder_state s ON s.id = r.id
 WHERE r.tenant = 'tenant-5' AND s.state = 'pending' AND r.key LIKE 'scale:%' ORDER BY r.id LIMIT 1""").split()[-1]
dups = psql(f"""SET search_path = {SCHEMA};
SELECT count(*) FROM reminders WHERE tenant = 'tenant-3' AND key LIKE 'campaign:7:%'""")

LIST_PARAMS = ["now", "before", "limit", "ids", "tenant", "states", "channel", "key_prefix", "due_from", "due_to",
               "deadline_from", "deadline_to", "late", "reason"]
LIST_TYPES = "timestamptz, bigint, bigint, bigint[], text, text[], text, text, timestamptz, timestamptz, " \
             "timestamptz, timestamptz, boolean, text"


def list_args(prefix):
    return f"'{NOW}', 0, 50, '{{}}', '', '{{}}', '', '{prefix}', NULL, NULL, NULL, NULL, false, ''"


# (label, write?, variant -> (prepared types or None, sql, execute args))
def statements(rev):
    ops, intake, camp, met = ("internal/ops/queries.sql", "pkg/intake/queries.sql",
                              "internal/campaign/queries.sql", "internal/metrics/queries.sql")
    after = rev is None
    sm = named(intake, "ScheduleMany", rev)
    return [
        ("nudge_campaign_status c7", False, (None, "SELECT * FROM nudge_campaign_status('tenant-3', 7)", None)),
        ("nudge_cancel_prefix c8 1000", True,
         (None, "SELECT * FROM nudge_cancel_prefix('tenant-3', 'campaign:8:', 1000)", None)),
        ("nudge_cancel one", True, (None, f"SELECT nudge_cancel('tenant-5', '{key}', 'bench', 'bench')", None)),
        ("nudge_update one", True,
         (None, f"SELECT * FROM nudge_update('tenant-5', '{key}', 'x@example.com', NULL, NULL)", None)),
        ("nudge_reschedule_to one", True,
         (None, f"SELECT * FROM nudge_reschedule_to('tenant-5', '{key}', '2027-01-01', '2027-01-02')", None)),
        ("intake Get by key", False,
         ("bigint, text, text", named(intake, "Get", rev), f"NULL, 'tenant-5', '{key}'")),
        ("intake CountPrefix c8", False,
         ("text, text", named(intake, "CountPrefix", rev), "'tenant-3', 'campaign:8:'")),
        ("campaign Deliveries c7", False,
         ("text, text, text", named(camp, "Deliveries", rev), "'tenant-3', 'campaign:7:', 'campaign:7;'")),
        ("ops ListIDs prefix c8, 50", False,
         (LIST_TYPES, dollars(named(ops, "ListIDsAll" if after else "ListIDs", rev), LIST_PARAMS),
          list_args("campaign:8:"))),
        ("ops ListIDs no filter, 50", False,
         (LIST_TYPES, dollars(named(ops, "ListIDsAll" if after else "ListIDs", rev), LIST_PARAMS), list_args(""))),
        ("ops ListRows 50", False,
         ("bigint[]", dollars(named(ops, "ListRows", rev), ["ids"]),
          "(SELECT array_agg(i) FROM generate_series(399951, 400000) i)")),
        ("ops StatsCounts", False, ("", named(ops, "StatsCounts", rev), "")),
        ("ops StatsAges", False, ("timestamptz", dollars(named(ops, "StatsAges", rev), ["now"]), f"'{NOW}'")),
        ("metrics DBGauges", False,
         ("timestamptz, timestamptz", dollars(named(met, "DBGauges", rev), ["now", "hour_ago"]),
          f"'{NOW}', '{NOW}'::timestamptz - interval '1 hour'")),
        (f"intake ScheduleMany {dups.strip()} duplicates", True,
         ("text[], text[], text[], text[], text[], text[], timestamptz[], timestamptz[], text, text[], timestamp[], "
          "timestamp[], time[], time[], integer[]", sm,
          ":'t', :'k', :'c', :'rc', :'tp', :'d', :'due', :'dl', 'bench', :'n', :'nts', :'nts', :'ntm', :'ntm', :'ni'")),
    ]


DUP_ARGS = f"""SELECT array_agg(tenant ORDER BY id) AS t, array_agg(key ORDER BY id) AS k, array_agg(channel ORDER BY id) AS c,
       array_agg(recipient ORDER BY id) AS rc, array_agg(template ORDER BY id) AS tp,
       array_agg(data::text ORDER BY id) AS d, array_agg(due_at ORDER BY id) AS due,
       array_agg(deadline ORDER BY id) AS dl, array_agg(NULL::text) AS n, array_agg(NULL::timestamp) AS nts,
       array_agg(NULL::time) AS ntm, array_agg(NULL::integer) AS ni
  FROM reminders WHERE tenant = 'tenant-3' AND key LIKE 'campaign:7:%' \\gset
"""


def explain(label, write, spec):
    types, sql, args = spec
    pre = f"SET search_path = {SCHEMA};\n"
    if write:
        pre += "BEGIN;\n"
    if types is None:
        body = f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {sql};\n"
    else:
        if label.startswith("intake ScheduleMany"):
            pre += DUP_ARGS
        prep = f"PREPARE q({types}) AS {sql};\n" if types else f"PREPARE q AS {sql};\n"
        ex = f"EXECUTE q({args})" if args else "EXECUTE q"
        if "ListRows" in label:  # a subquery is no EXECUTE parameter: \gset it first
            pre += f"SELECT {args}::text AS ids \\gset\n"
            ex = "EXECUTE q(:'ids')"
        body = prep + f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {ex};\n"
    out = psql(pre + body + ("ROLLBACK;\n" if write else ""))
    j = json.loads(out[out.index("["):out.rindex("]") + 1])[0]
    p = j["Plan"]
    return j["Execution Time"], p.get("Shared Hit Blocks", 0) + p.get("Shared Read Blocks", 0)


def main():
    with open("/proc/loadavg") as f:
        print("load", " ".join(f.read().split()[:3]), flush=True)
    variants = {"before": (functions(BASE), statements(BASE)), "after": (functions(None), statements(None))}
    results = {}
    for _ in range(2):
        for v in ["before", "after", "after", "before"]:
            fns, stmts = variants[v]
            psql(fns)
            for label, write, spec in stmts:
                for _ in range(2):
                    ms, buf = explain(label, write, spec)
                    results.setdefault((label, v), []).append((ms, buf))
                    print(f"{label} {v}: {ms:.1f} ms  buffers={buf}", flush=True)
    psql(variants["after"][0])
    with open("/proc/loadavg") as f:
        print("load", " ".join(f.read().split()[:3]), flush=True)
    print("\nstatement | buffers before | buffers after | ms before (min-max) | ms after (min-max)")
    for label, _, _ in variants["after"][1]:
        b, a = results[(label, "before")], results[(label, "after")]
        rng = lambda xs, i: f"{min(x[i] for x in xs):,.0f}-{max(x[i] for x in xs):,.0f}"
        print(f"{label} | {rng(b, 1)} | {rng(a, 1)} | {rng(b, 0)} | {rng(a, 0)}")


main()
