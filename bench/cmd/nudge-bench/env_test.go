package main

import (
	"math"
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	// utime 150, stime 50, cutime 300, cstime 100 ticks; starttime 98765.
	const line = "4242 (postgres: bench) S 1 4242 4242 0 -1 4194560 100 0 0 0 150 50 300 100 20 0 1 0 98765 1000 10"
	for _, c := range []struct {
		name            string
		pid, self, prov int
		want            owner
	}{
		{"a backend", 4242, 1, 2, ownerPostgres},
		{"the harness", 4242, 4242, 2, ownerHarness},
		{"the fake provider", 4242, 1, 4242, ownerProvider},
	} {
		p, reaped, ok := parseStat(line, c.pid, c.self, c.prov)
		if !ok || p.owner != c.want || p.started != 98765 || !approx(p.sec, 2.0) || !approx(reaped, 4.0) {
			t.Errorf("%s: parseStat = %+v, reaped %v, %v; want owner %d, started 98765, 2 s, reaped 4 s", c.name, p, reaped, ok, c.want)
		}
	}
	if p, _, ok := parseStat("77 (beam.smp) S 1 77 77 0 -1 0 0 0 0 0 5 5 0 0 20 0 30 0 555 0 0", 77, 1, 2); !ok || p.owner != ownerRabbitMQ {
		t.Errorf("beam.smp: %+v %v; want RabbitMQ's", p, ok)
	}
	if _, _, ok := parseStat("77 (truncated) S 1", 77, 1, 2); ok {
		t.Error("a truncated line parsed")
	}
}

func TestCPUSampleSub(t *testing.T) {
	pg := func(started uint64, sec float64) procTime {
		return procTime{owner: ownerPostgres, started: started, sec: sec}
	}
	for _, c := range []struct {
		name       string
		start, end cpuSample
		want       float64 // PostgreSQL's CPU-s between them
	}{
		{"a backend in both counts its increase",
			cpuSample{procs: map[int]procTime{10: pg(1, 5)}},
			cpuSample{procs: map[int]procTime{10: pg(1, 7.5)}}, 2.5},
		{"a backend started in between counts all of it",
			cpuSample{procs: map[int]procTime{}},
			cpuSample{procs: map[int]procTime{11: pg(2, 3)}}, 3},
		{"a backend that exited in between counts what the postmaster reaped less its CPU before",
			cpuSample{procs: map[int]procTime{10: pg(1, 5), 12: pg(1, 40)}, reaped: cpuTicks{Postgres: 100}},
			cpuSample{procs: map[int]procTime{10: pg(1, 6)}, reaped: cpuTicks{Postgres: 142}}, 1 + 2},
		{"a reused pid is a new process",
			cpuSample{procs: map[int]procTime{10: pg(1, 50)}, reaped: cpuTicks{Postgres: 0}},
			cpuSample{procs: map[int]procTime{10: pg(9, 1)}, reaped: cpuTicks{Postgres: 51}}, 1 + 1},
		{"an exited backend not yet reaped is lost, never negative (a difference of sums read -40 here)",
			cpuSample{procs: map[int]procTime{10: pg(1, 5), 12: pg(1, 40)}},
			cpuSample{procs: map[int]procTime{10: pg(1, 5)}}, 0},
	} {
		got := c.end.sub(c.start)
		if !approx(got.Postgres, c.want) {
			t.Errorf("%s: PostgreSQL %v CPU-s, want %v", c.name, got.Postgres, c.want)
		}
	}
}

func TestReadCPUFindsTheHarness(t *testing.T) {
	start := readCPU()
	if _, ok := start.procs[os.Getpid()]; !ok {
		t.Fatal("this process is not in the sample")
	}
	x := 0.0
	for i := range 30_000_000 { // ~20 ms of CPU: at least one clock tick
		x += math.Sqrt(float64(i))
	}
	if got := readCPU().sub(start); got.Harness <= 0 || got.Postgres < 0 || got.RabbitMQ < 0 {
		t.Errorf("after spinning (%v): %+v; want the harness's CPU above zero and no owner below", x, got)
	}
}

func approx(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestPGKindOf(t *testing.T) {
	for _, c := range []struct {
		cmdline string
		want    pgKind
	}{
		{"postgres: postgres test 127.0.0.1(54312) idle", pgBackend},
		{"postgres: nudge_worker test 10.0.0.7(40100) UPDATE", pgBackend},
		{"postgres: autovacuum worker test", pgAutovacuum},
		{"postgres: autovacuum launcher", pgServer},
		{"postgres: walwriter", pgServer},
		{"postgres: checkpointer", pgServer},
		{"postgres: background writer", pgServer},
		{"postgres: logical replication launcher", pgServer},
		{"postgres: 15/main: checkpointer", pgServer},
		{"postgres: 15/main: autovacuum worker test", pgAutovacuum},
		{"postgres: 15/main: postgres test 127.0.0.1(54312) idle in transaction", pgBackend},
		{"/usr/lib/postgresql/15/bin/postgres -D /var/lib/postgresql/15/main -c config_file=/etc/postgresql/15/main/postgresql.conf", pgServer},
	} {
		if got := pgKindOf(c.cmdline); got != c.want {
			t.Errorf("pgKindOf(%q) = %d, want %d", c.cmdline, got, c.want)
		}
	}
}

func TestSubSplitsPostgres(t *testing.T) {
	start := cpuSample{procs: map[int]procTime{
		1: {owner: ownerPostgres, started: 1, sec: 10, pg: pgBackend},
		2: {owner: ownerPostgres, started: 1, sec: 3, pg: pgServer},
	}}
	end := cpuSample{procs: map[int]procTime{
		1: {owner: ownerPostgres, started: 1, sec: 14, pg: pgBackend},
		2: {owner: ownerPostgres, started: 1, sec: 4, pg: pgServer},
		3: {owner: ownerPostgres, started: 9, sec: 2, pg: pgAutovacuum},
	}}
	got := end.sub(start)
	if !approx(got.Postgres, 7) || !approx(got.PGBackends, 4) || !approx(got.PGAutovacuum, 2) {
		t.Errorf("got PostgreSQL %v (backends %v, autovacuum %v), want 7 (4, 2)", got.Postgres, got.PGBackends, got.PGAutovacuum)
	}
}
