package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// The planning benchmark (issue 15) writes the same N reminder intents three
// ways, each into a schema of its own:
//
//   - a campaign planned by one planner (internal/campaign, in-process)
//     consuming its own chain of planning commands through RabbitMQ: each
//     slice of 200 audience rows is one transaction (lock, read, the bulk
//     intake statement, checkpoint) and a confirmed continuation;
//   - `nudgectl schedule -f` of a JSON Lines file of the same reminders,
//     the real binary as an operator runs it;
//   - the SQL function nudge_schedule, one call (one transaction) per
//     reminder over one connection, as a web tier that schedules as it
//     goes calls it.
//
// Intents per second is N over the time from the start to the last intent
// written: for the planner, from publishing the first command to the
// campaign's end (its ended_at).
//
// Then, for issue 18's function-path bar, the same N intents twice more in
// statements of 1,000 rows, nudge_schedule once per row and the bulk
// statement, each timed by its PostgreSQL backend's CPU (intakeCPURun).

type planningResult struct {
	N int
	// PlannerRate: intents/s of one planner; SliceMs its slices' mean time
	// (nudge_campaign_slice_duration_seconds: transaction and confirm);
	// CycleMs the median slice start to next slice start (the queue hop
	// included); Slices how many it took.
	PlannerRate, SliceMs, CycleMs float64
	Slices                        int
	// FileRate: nudgectl schedule -f; SQLRate: nudge_schedule per row.
	FileRate, SQLRate float64
	// SQLCPU, FnRowsCPU, BulkCPU: the PostgreSQL backend's CPU-s per
	// 1,000 intents of nudge_schedule one call per transaction (the
	// SQLRate run), of nudge_schedule once per row of statements of
	// intakeCPUStatement rows, and of the bulk statement over the same
	// rows (intakeCPURun).
	SQLCPU, FnRowsCPU, BulkCPU float64
	// ManyCPU: nudge_schedule_many (schema 50), the bulk statement called
	// from SQL with the same rows, as a web tier in any language may.
	ManyCPU float64
}

// intakeCPUStatement is the rows per statement of intakeCPURun's two
// ways, as pkg/intake's BenchmarkScheduleFunctionVsBulk sends them
// (nudgectl schedule -f sends 2,000, a campaign slice 200).
const intakeCPUStatement = 1000

// planningSliceSize is the campaigns' default slice (schema 20).
const planningSliceSize = 200

// buildNudgectl builds cmd/nudgectl into a temporary directory.
func buildNudgectl(ctx context.Context, repo string) (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "nudge-bench-ctl-")
	if err != nil {
		return "", nil, fmt.Errorf("building nudgectl: %w", err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-o", dir+string(filepath.Separator), "./cmd/nudgectl")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("go build ./cmd/nudgectl in %s: %w\n%s", repo, err, out)
	}
	return filepath.Join(dir, "nudgectl"), func() { _ = os.RemoveAll(dir) }, nil
}

// planningSchema creates and migrates a schema of its own.
func planningSchema(ctx context.Context, e *env, prefix string) (*pgxpool.Pool, string, func(), error) {
	name, drop, err := e.newSchema(ctx, prefix)
	if err != nil {
		return nil, "", nil, err
	}
	url := e.schemaURL(name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		drop()
		return nil, "", nil, fmt.Errorf("connecting to schema %s: %w", name, err)
	}
	done := func() { pool.Close(); drop() }
	if _, err := migrate(ctx, pool); err != nil {
		done()
		return nil, "", nil, fmt.Errorf("migrating %s: %w", name, err)
	}
	return pool, url, done, nil
}

// planningBackend is a schema of its own (planningSchema) and one
// connection to it with its backend's pid, whose CPU a run reads; done
// releases the connection and drops the schema.
func planningBackend(ctx context.Context, e *env, prefix string) (pool *pgxpool.Pool, conn *pgxpool.Conn, pid int, done func(), err error) {
	pool, _, drop, err := planningSchema(ctx, e, prefix)
	if err != nil {
		return nil, nil, 0, nil, err
	}
	if conn, err = pool.Acquire(ctx); err != nil {
		drop()
		return nil, nil, 0, nil, err
	}
	done = func() { conn.Release(); drop() }
	if err := conn.QueryRow(ctx, stmt("BackendPID")).Scan(&pid); err != nil {
		done()
		return nil, nil, 0, nil, err
	}
	return pool, conn, pid, done, nil
}

// planningReminder is reminder i as all three ways write it.
func planningReminder(i int, due time.Time) (tenant, key, recipient string, data map[string]any) {
	return "tenant-0", fmt.Sprintf("campaign-bench:%d", i), fmt.Sprintf("learner-%d@example.org", i),
		map[string]any{"course": "Go 101", "learner": i}
}

func planningRun(ctx context.Context, e *env, nudgectl string, n int) (res planningResult, err error) {
	res.N = n
	if err := plannerRun(ctx, e, n, &res); err != nil {
		return res, fmt.Errorf("planner: %w", err)
	}
	if res.FileRate, err = scheduleFileRun(ctx, e, nudgectl, n); err != nil {
		return res, fmt.Errorf("nudgectl schedule -f: %w", err)
	}
	if res.SQLRate, res.SQLCPU, err = scheduleSQLRun(ctx, e, n); err != nil {
		return res, fmt.Errorf("nudge_schedule: %w", err)
	}
	if res.FnRowsCPU, err = intakeCPURun(ctx, e, n, intakeFunctionPerRow); err != nil {
		return res, fmt.Errorf("nudge_schedule once per row: %w", err)
	}
	if res.BulkCPU, err = intakeCPURun(ctx, e, n, intakeBulk); err != nil {
		return res, fmt.Errorf("the bulk intake: %w", err)
	}
	if res.ManyCPU, err = intakeCPURun(ctx, e, n, intakeMany); err != nil {
		return res, fmt.Errorf("nudge_schedule_many: %w", err)
	}
	return res, nil
}

// intakeWay is how intakeCPURun writes its intents.
type intakeWay int

const (
	// intakeBulk: intake.ScheduleMany, the statement behind nudgectl
	// schedule -f, campaign slices and a Go web tier's batches.
	intakeBulk intakeWay = iota
	// intakeFunctionPerRow: nudge_schedule once per row (SELECT
	// count(nudge_schedule(...)) FROM unnest(...)), as an import written in
	// SQL calls it.
	intakeFunctionPerRow
	// intakeMany: nudge_schedule_many (schema 50), the same statement as
	// the bulk path behind a SQL function, with the rows as arrays.
	intakeMany
)

// intakeCPURun writes the N intents into a schema of its own over one
// connection, in statements of intakeCPUStatement rows, the given way, and
// returns the backend's CPU-s per 1,000 (/proc/<pid>/schedstat,
// nanoseconds). Issue 18's bar: the function once per row at most 1.5× the
// bulk path. Every way runs as the schema's owner, after one intent that
// warms the backend's caches and plans.
func intakeCPURun(ctx context.Context, e *env, n int, way intakeWay) (float64, error) {
	pool, conn, pid, done, err := planningBackend(ctx, e, "bench_intake")
	if err != nil {
		return 0, err
	}
	defer done()
	due := time.Now().Add(time.Hour).UTC()
	deadline := due.Add(47 * time.Hour)
	write := func(from, to int) error {
		if way == intakeBulk {
			reqs := make([]intake.Request, 0, to-from)
			for i := from; i < to; i++ {
				tenant, key, recipient, data := planningReminder(i, due)
				reqs = append(reqs, intake.Request{Tenant: tenant, Key: key, Channel: reminder.Email, Recipient: recipient,
					Template: "course-expiry", Data: data, DueAt: due, Deadline: deadline})
			}
			out, err := intake.ScheduleMany(ctx, conn, reqs)
			if err != nil {
				return err
			}
			for _, o := range out {
				if o.Err != nil || o.Status != intake.Created {
					return fmt.Errorf("intent %d: %s %v", from, o.Status, o.Err)
				}
			}
			return nil
		}
		var tenants, keys, recipients []string
		var datas []map[string]any
		for i := from; i < to; i++ {
			tenant, key, recipient, data := planningReminder(i, due)
			tenants, keys, recipients, datas = append(tenants, tenant), append(keys, key), append(recipients, recipient), append(datas, data)
		}
		var got int
		q := stmt("NudgeScheduleRows")
		if way == intakeMany {
			q = stmt("NudgeScheduleMany")
		}
		if err := conn.QueryRow(ctx, q, tenants, keys, recipients, datas, due, deadline).Scan(&got); err != nil {
			return err
		}
		if got != to-from {
			return fmt.Errorf("%d of %d intents scheduled", got, to-from)
		}
		return nil
	}
	if err := write(0, 1); err != nil { // intent 0 warms the backend
		return 0, err
	}
	cpu0, start := backendCPU(pid), time.Now()
	for from := 1; from <= n; from += intakeCPUStatement {
		if err := write(from, min(from+intakeCPUStatement, n+1)); err != nil {
			return 0, err
		}
	}
	cpu1 := backendCPU(pid)
	e.measuredSince(start)
	if cpu0 < 0 || cpu1 < 0 {
		return 0, fmt.Errorf("reading the backend's CPU from /proc/%d/schedstat (is PostgreSQL on this machine?)", pid)
	}
	var got int
	if err := pool.QueryRow(ctx, stmt("ReminderCount")).Scan(&got); err != nil {
		return 0, err
	}
	if got != n+1 {
		return 0, fmt.Errorf("%d of %d reminders scheduled", got, n+1)
	}
	return (cpu1 - cpu0) * 1000 / float64(n), nil
}

func plannerRun(ctx context.Context, e *env, n int, res *planningResult) error {
	pool, _, done, err := planningSchema(ctx, e, "bench_plan")
	if err != nil {
		return err
	}
	defer done()
	if _, err := pool.Exec(ctx, stmt("PlanAudience"), pgx.QueryExecModeSimpleProtocol, pgx.NamedArgs{"n": n}); err != nil {
		return fmt.Errorf("seeding the audience: %w", err)
	}
	topo := broker.Topology{Prefix: "nudge-bench-" + testenv.RandomID()}.Planning()
	conn, err := broker.Dial(e.amqpURL, "nudge-bench-declare")
	if err != nil {
		return fmt.Errorf("connecting to RabbitMQ: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = topo.Declare(ch)
	}
	conn.Close()
	if err != nil {
		return fmt.Errorf("declaring the planning queue: %w", err)
	}
	defer func() {
		if conn, err := broker.Dial(e.amqpURL, "nudge-bench-cleanup"); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_ = topo.Delete(ch)
			}
			conn.Close()
		}
	}()
	root, err := message.ParseKeys("bench:nudge-bench-signing-key-0123456789abcdef")
	if err != nil {
		return err
	}
	spec, err := root.ChannelSpec(campaign.Channel)
	if err != nil {
		return err
	}
	keys, err := message.ParseKeys(spec)
	if err != nil {
		return err
	}
	now := time.Now()
	due := now.Add(time.Hour)
	id, _, err := campaign.Create(ctx, pool, campaign.Spec{Tenant: "tenant-0", Name: "bench", Channel: "email",
		Template: "course-expiry", Source: "bench", DueAt: &due, Deadline: now.Add(48 * time.Hour), SliceSize: planningSliceSize})
	if err != nil {
		return err
	}
	pub := broker.NewPublisher(e.amqpURL, topo, "nudge-bench-planner")
	defer pub.Close()
	reg := prometheus.NewRegistry()
	p := &campaign.Planner{Pool: pool, Keys: keys, Publisher: pub, Topology: topo, Clock: clock.Real{},
		Name: "bench-planner", Log: zerolog.Nop(), Metrics: metrics.NewPlanner(reg)}
	cctx, stop := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() { consumed <- p.Consume(cctx, e.amqpURL) }()
	defer func() { stop(); <-consumed }()
	start := time.Now()
	if err := campaign.Publish(ctx, pub, topo, keys, start, campaign.Command{ID: id, Tenant: "tenant-0",
		Deadline: now.Add(48 * time.Hour)}); err != nil {
		return err
	}
	var (
		state   string
		planned int64
		ended   *time.Time
	)
	for {
		if err := pool.QueryRow(ctx, stmt("PlanProgress"), id).Scan(&state, &planned, &ended); err != nil {
			return err
		}
		if state != "planning" {
			break
		}
		select {
		case err := <-consumed:
			return fmt.Errorf("the planner stopped: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	e.measuredSince(start)
	if state != "done" || planned != int64(n) || ended == nil {
		return fmt.Errorf("the campaign ended %s with %d of %d planned", state, planned, n)
	}
	res.PlannerRate = float64(n) / ended.Sub(start).Seconds()
	rows, err := pool.Query(ctx, stmt("PlanSliceStarts"), id)
	if err != nil {
		return err
	}
	starts, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	if err != nil {
		return err
	}
	res.Slices = len(starts)
	var cycles []float64
	for i := 1; i < len(starts); i++ {
		cycles = append(cycles, millis(starts[i].Sub(starts[i-1])))
	}
	res.CycleMs = percentile(cycles, 0.5)
	fams, err := reg.Gather()
	if err != nil {
		return err
	}
	for _, f := range fams {
		if f.GetName() == "nudge_campaign_slice_duration_seconds" {
			h := f.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() > 0 {
				res.SliceMs = 1000 * h.GetSampleSum() / float64(h.GetSampleCount())
			}
		}
	}
	return nil
}

// scheduleFileRun writes the N reminders as JSON Lines and times the real
// nudgectl schedule -f on them.
func scheduleFileRun(ctx context.Context, e *env, nudgectl string, n int) (float64, error) {
	pool, url, done, err := planningSchema(ctx, e, "bench_file")
	if err != nil {
		return 0, err
	}
	defer done()
	f, err := os.CreateTemp("", "nudge-bench-*.jsonl")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	due := time.Now().Add(time.Hour).UTC()
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for i := 1; i <= n; i++ {
		tenant, key, recipient, data := planningReminder(i, due)
		if err := enc.Encode(map[string]any{"tenant": tenant, "key": key, "channel": "email", "recipient": recipient,
			"template": "course-expiry", "data": data, "due_at": due, "deadline": due.Add(47 * time.Hour)}); err != nil {
			return 0, err
		}
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, nudgectl, "schedule", "-f", f.Name(), "--database-url", url, "--log-level", "warn")
	for _, kv := range os.Environ() {
		if len(kv) < 6 || kv[:6] != "NUDGE_" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("%w\n%s", err, truncate(string(out), 2000))
	}
	elapsed := time.Since(start)
	e.measuredSince(start)
	var got int
	if err := pool.QueryRow(ctx, stmt("ReminderCount")).Scan(&got); err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("%d of %d reminders scheduled", got, n)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// scheduleSQLRun calls nudge_schedule once per reminder, each call its own
// transaction, over one connection, and returns the intents per second and
// the backend's CPU-s per 1,000.
func scheduleSQLRun(ctx context.Context, e *env, n int) (rate, cpu float64, err error) {
	_, conn, pid, done, err := planningBackend(ctx, e, "bench_sql")
	if err != nil {
		return 0, 0, err
	}
	defer done()
	due := time.Now().Add(time.Hour).UTC()
	cpu0, start := backendCPU(pid), time.Now()
	for i := 1; i <= n; i++ {
		tenant, key, recipient, data := planningReminder(i, due)
		if _, err := conn.Exec(ctx, stmt("NudgeScheduleOne"), tenant, key, "email", recipient, "course-expiry",
			data, due, due.Add(47*time.Hour)); err != nil {
			return 0, 0, fmt.Errorf("reminder %d: %w", i, err)
		}
	}
	elapsed, cpu1 := time.Since(start), backendCPU(pid)
	e.measuredSince(start)
	if cpu0 < 0 || cpu1 < 0 {
		return 0, 0, fmt.Errorf("reading the backend's CPU from /proc/%d/schedstat (is PostgreSQL on this machine?)", pid)
	}
	return float64(n) / elapsed.Seconds(), (cpu1 - cpu0) * 1000 / float64(n), nil
}
