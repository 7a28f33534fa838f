package main

import (
	"bufio"
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/testenv"
)

// env is where every benchmark runs: one PostgreSQL database (each benchmark
// takes a schema of its own) and one RabbitMQ (each takes a queue prefix).
type env struct {
	dbURL   string
	amqpURL string
	admin   *pgxpool.Pool
	// measured is the wall time the run functions spent measuring since
	// main last took it (takeMeasured): from the moment a measurement's
	// clock starts to the moment the harness sees its end. The rest of a
	// section's wall time is its setup (schemas, seeding, warm-ups, table
	// builds, WAL counting, cleanup), the part a faster harness can cut.
	measured time.Duration
}

// measuredSince adds the wall time since t0 to the running section's
// measurement. The run functions call it from the goroutine that runs them.
func (e *env) measuredSince(t0 time.Time) { e.measured += time.Since(t0) }

// takeMeasured returns the measurement time added since the last call.
func (e *env) takeMeasured() time.Duration {
	d := e.measured
	e.measured = 0
	return d
}

// schemaURL returns dbURL with search_path set to schema.
func (e *env) schemaURL(schema string) string {
	u, _ := url.Parse(e.dbURL)
	q := u.Query()
	q.Set("search_path", schema)
	// JIT off, as Nudge's binaries set it (config.Common.Pool), for both
	// systems: it only costs short statements that run thousands of times.
	q.Set("jit", "off")
	u.RawQuery = q.Encode()
	return u.String()
}

// newSchema creates a schema and returns a drop function, which says so on
// stderr when the drop fails (the scale tables are gigabytes).
func (e *env) newSchema(ctx context.Context, prefix string) (string, func(), error) {
	name := prefix + "_" + testenv.RandomID()
	if _, err := e.admin.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		return "", nil, fmt.Errorf("creating schema %s: %w", name, err)
	}
	return name, func() { e.dropSchema(name) }, nil
}

// dropSchema drops a schema and everything in it, with a context of its own
// so that it also runs after an interrupt.
func (e *env) dropSchema(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := e.admin.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
		fmt.Fprintf(os.Stderr, "nudge-bench: dropping schema %s: %v (drop it by hand)\n", name, err)
	}
}

// stats is the median, min and max of a measurement's runs.
type stats struct{ Median, Min, Max float64 }

func summarize(xs []float64) stats {
	if len(xs) == 0 {
		return stats{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stats{Median: m, Min: s[0], Max: s[len(s)-1]}
}

// cpuTicks are CPU seconds (user+system) by owner, read from /proc.
// Provider is the fake SMS provider's process (provider.go): the server side
// of the HTTP call, not Nudge's cost.
type cpuTicks struct {
	Postgres, RabbitMQ, Harness, Provider, Other float64
	// PGBackends and PGAutovacuum are parts of Postgres: the client
	// backends (the statements) and the autovacuum workers, as their
	// command lines name them while they run. The rest of Postgres is the
	// server's own processes (WAL writer, checkpointer, background writer,
	// postmaster) and what exited processes used (pgKind).
	PGBackends, PGAutovacuum float64
}

// per1000 is the figures per 1,000 of n items, PostgreSQL's split among
// its processes, for the progress lines.
func (c cpuTicks) per1000(n int) string {
	f := 1000 / float64(max(1, n))
	return fmt.Sprintf("PostgreSQL %.3f (backends %.3f, autovacuum %.3f, server and exited %.3f), RabbitMQ %.3f, harness %.3f, fake provider %.3f, other %.3f",
		c.Postgres*f, c.PGBackends*f, c.PGAutovacuum*f, (c.Postgres-c.PGBackends-c.PGAutovacuum)*f,
		c.RabbitMQ*f, c.Harness*f, c.Provider*f, c.Other*f)
}

// pgKind is which part of PostgreSQL's CPU a postgres process's is.
type pgKind int

const (
	pgServer pgKind = iota // WAL writer, checkpointer, background writer, launchers, postmaster
	pgBackend
	pgAutovacuum
)

// pgKindOf classifies a postgres process by its command line, which the
// server sets to "postgres: <what it is>": "postgres: autovacuum worker
// test", "postgres: walwriter", "postgres: <user> <db> <host> <state>";
// with cluster_name set (Debian's clusters: "15/main") after it and a
// colon: "postgres: 15/main: walwriter".
func pgKindOf(cmdline string) pgKind {
	what, ok := strings.CutPrefix(cmdline, "postgres: ")
	if !ok {
		return pgServer // the postmaster: its binary's path and flags
	}
	if _, rest, named := strings.Cut(what, ": "); named {
		what = rest
	}
	switch {
	case strings.HasPrefix(what, "autovacuum worker"):
		return pgAutovacuum
	case strings.HasPrefix(what, "autovacuum launcher"), strings.HasPrefix(what, "walwriter"),
		strings.HasPrefix(what, "checkpointer"), strings.HasPrefix(what, "background writer"),
		strings.HasPrefix(what, "logical replication"), strings.HasPrefix(what, "archiver"),
		strings.HasPrefix(what, "stats collector"), strings.HasPrefix(what, "walsender"),
		strings.HasPrefix(what, "startup"), strings.HasPrefix(what, "walreceiver"):
		return pgServer
	}
	return pgBackend
}

const clockTicks = 100.0 // USER_HZ on Linux

// owner is whose cost a process's CPU is: a field of cpuTicks.
type owner int

const (
	ownerOther owner = iota
	ownerPostgres
	ownerRabbitMQ
	ownerHarness
	ownerProvider
)

func (c *cpuTicks) add(o owner, sec float64) {
	switch o {
	case ownerPostgres:
		c.Postgres += sec
	case ownerRabbitMQ:
		c.RabbitMQ += sec
	case ownerHarness:
		c.Harness += sec
	case ownerProvider:
		c.Provider += sec
	default:
		c.Other += sec
	}
}

// cpuSample is one reading of every process's CPU time from /proc. The
// difference of two (sub) counts each process's own CPU between them, so
// that a process exiting in between neither takes its earlier CPU out of
// the figure (a difference of sums went negative when a busy PostgreSQL
// backend exited during a latency run) nor loses what it used in between.
type cpuSample struct {
	procs map[int]procTime
	// reaped is, for the servers (PostgreSQL, RabbitMQ), the CPU of the
	// children their processes have reaped (cutime + cstime): the
	// postmaster's grows by a backend's whole CPU when the backend exits.
	reaped cpuTicks
}

// procTime is one process in a cpuSample.
type procTime struct {
	owner owner
	// started is the process's start time (clock ticks after boot), which
	// tells a reused pid apart.
	started uint64
	sec     float64
	// pg is which part of PostgreSQL's CPU a postgres process's is.
	pg pgKind
}

func readCPU() cpuSample {
	c := cpuSample{procs: map[int]procTime{}}
	self, provider := os.Getpid(), int(fakeProviderPID.Load())
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		p, reaped, ok := parseStat(string(b), pid, self, provider)
		if !ok {
			continue
		}
		if p.owner == ownerPostgres {
			cmd, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
			p.pg = pgKindOf(strings.TrimRight(strings.ReplaceAll(string(cmd), "\x00", " "), " "))
		}
		c.procs[pid] = p
		if p.owner == ownerPostgres || p.owner == ownerRabbitMQ {
			c.reaped.add(p.owner, reaped)
		}
	}
	return c
}

// parseStat reads one /proc/PID/stat line: the process's owner (self is
// the harness, provider the fake provider's pid), its start time and CPU
// seconds, and the CPU seconds of the children it has reaped.
func parseStat(s string, pid, self, provider int) (p procTime, reaped float64, ok bool) {
	open, close := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || close < open || close+2 > len(s) {
		return p, 0, false
	}
	comm := s[open+1 : close]
	f := strings.Fields(s[close+2:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return p, 0, false
	}
	ticks := func(i int) float64 { v, _ := strconv.ParseFloat(f[i], 64); return v / clockTicks }
	p.sec = ticks(11) + ticks(12)                   // utime, stime
	reaped = ticks(13) + ticks(14)                  // cutime, cstime
	p.started, _ = strconv.ParseUint(f[19], 10, 64) // starttime
	switch {
	case pid == self:
		p.owner = ownerHarness
	case pid == provider:
		p.owner = ownerProvider
	case comm == "postgres" || strings.HasPrefix(comm, "postgres"):
		p.owner = ownerPostgres
	case comm == "beam.smp" || comm == "erl_child_setup" || comm == "epmd" || comm == "inet_gethost":
		p.owner = ownerRabbitMQ
	default:
		p.owner = ownerOther
	}
	return p, reaped, true
}

// sub is the CPU each owner's processes used from start to end: a process
// in both samples counts its increase, one started in between all of its
// CPU, and one of the servers' that exited in between what its parent
// reaped less what it had used before start (never below zero: a child not
// yet reaped is lost, not negative). Other processes that exited in
// between are not counted.
func (end cpuSample) sub(start cpuSample) cpuTicks {
	var c, gone cpuTicks
	for pid, e := range end.procs {
		d := e.sec
		if s, ok := start.procs[pid]; ok && s.started == e.started {
			d -= s.sec
		}
		c.add(e.owner, d)
		if e.owner == ownerPostgres {
			switch e.pg {
			case pgBackend:
				c.PGBackends += d
			case pgAutovacuum:
				c.PGAutovacuum += d
			}
		}
	}
	for pid, s := range start.procs {
		if e, ok := end.procs[pid]; !ok || e.started != s.started {
			gone.add(s.owner, s.sec)
		}
	}
	c.Postgres += max(0, end.reaped.Postgres-start.reaped.Postgres-gone.Postgres)
	c.RabbitMQ += max(0, end.reaped.RabbitMQ-start.reaped.RabbitMQ-gone.RabbitMQ)
	return c
}

// resetPeakRSS resets VmHWM of this process (Linux: clear_refs 5).
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSSMiB reads VmHWM of this process.
func peakRSSMiB() float64 { return vmHWM("/proc/self/status") }

// vmHWM reads the peak resident set size (VmHWM) from a /proc/*/status
// file, in MiB; 0 when the process is gone.
func vmHWM(status string) float64 {
	f, err := os.Open(status)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// cpuSeconds is the user+system CPU time of one process, from /proc; 0 when
// it is gone.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0
	}
	s := string(b)
	close := strings.LastIndexByte(s, ')')
	if close < 0 || close+2 > len(s) {
		return 0
	}
	f := strings.Fields(s[close+2:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / clockTicks
}

// machine describes where the figures were measured.
type machine struct {
	CPUs     int
	CPUModel string
	MemGiB   float64
	Go       string
	Postgres string
	// SharedBuffers is PostgreSQL's buffer cache: whether a table fits in it
	// decides what the scale runs read from the OS.
	SharedBuffers string
	// JIT is PostgreSQL's JIT setting and thresholds: a statement whose
	// cost estimate passes them is compiled on every execution.
	JIT      string
	RabbitMQ string
	Kernel   string
	When     time.Time
}

func describe(ctx context.Context, e *env) machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), When: time.Now().UTC()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %f kB", &kb)
		m.MemGiB = kb / 1024 / 1024
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	_ = e.admin.QueryRow(ctx, "SHOW server_version").Scan(&m.Postgres)
	_ = e.admin.QueryRow(ctx, "SHOW shared_buffers").Scan(&m.SharedBuffers)
	var jit, above, inline, optimize string
	if e.admin.QueryRow(ctx, "SELECT current_setting('jit'), current_setting('jit_above_cost'), current_setting('jit_inline_above_cost'), current_setting('jit_optimize_above_cost')").
		Scan(&jit, &above, &inline, &optimize) == nil {
		m.JIT = fmt.Sprintf("`jit` %s: above a cost of %s, inlining above %s, optimization above %s", jit, above, inline, optimize)
	}
	if conn, err := amqp.Dial(e.amqpURL); err == nil {
		if v, ok := conn.Properties["version"].(string); ok {
			m.RabbitMQ = v
		}
		conn.Close()
	}
	return m
}

// loadAvg is the 1-minute load average.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return v
}

// cpuPressure is the "some" total of /proc/pressure/cpu (PSI): the time
// during which at least one runnable task of the machine waited for a CPU;
// ok is false without PSI.
func cpuPressure() (d time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return 0, false
	}
	for _, f := range strings.Fields(strings.SplitN(string(b), "\n", 2)[0]) {
		if v, found := strings.CutPrefix(f, "total="); found {
			us, err := strconv.ParseInt(v, 10, 64)
			return time.Duration(us) * time.Microsecond, err == nil
		}
	}
	return 0, false
}

// runDelay is the time this process's threads have spent runnable but
// waiting for a CPU (the second field of /proc/PID/task/TID/schedstat),
// summed over the threads alive now.
func runDelay() time.Duration {
	tasks, _ := os.ReadDir("/proc/self/task")
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", t.Name(), "schedstat"))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			sum += time.Duration(ns)
		}
	}
	return sum
}
