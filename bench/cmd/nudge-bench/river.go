package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/nudgehq/nudge/internal/provider"
)

type noopArgs struct {
	N int `json:"n"`
}

func (noopArgs) Kind() string { return "nudge_bench_noop" }

// noopWorker does nothing but count its jobs (see pollDB).
type noopWorker struct {
	river.WorkerDefaults[noopArgs]
	worked *atomic.Int64
}

func (w noopWorker) Work(context.Context, *river.Job[noopArgs]) error {
	w.worked.Add(1)
	return nil
}

// smsJobWorker sends each job's SMS through sender (fakeSMS's client, which
// counts the sends for pollDB), the message Nudge's e2e run sends for its
// reminder of the same number (nudgeSetup.schedule): same recipient,
// template, data and idempotency key. A send that fails fails the job,
// which River retries later; the run then does not complete and says so.
type smsJobWorker struct {
	river.WorkerDefaults[noopArgs]
	sender countedSMS
}

func (w *smsJobWorker) Work(ctx context.Context, job *river.Job[noopArgs]) error {
	i := job.Args.N
	_, err := w.sender.Send(ctx, provider.Message{
		ReminderID: job.ID, IdempotencyKey: fmt.Sprintf("bench:%d", i), Tenant: fmt.Sprintf("tenant-%d", i%4),
		Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
		Data: map[string]any{"course": "Go 101"}, Deadline: job.CreatedAt.Add(48 * time.Hour),
	})
	return err
}

// riverResult is one River run.
type riverResult struct {
	Rate    float64 // jobs/s, first attempt to last completion
	Elapsed time.Duration
	CPU     cpuTicks
	WAL     walUsage
	RSS     float64
}

// riverPerWorker is the River concurrency granted per "worker": the number
// of deliveries one Nudge worker holds in flight by default (Concurrency 4 ×
// Batch 50).
const riverPerWorker = 200

// The client settings River's own benchmark command (`river bench`,
// cmd/river/riverbench/river_bench.go in riverqueue/river) uses, which its
// comments say give much better throughput than the client's defaults
// (FetchCooldown 100 ms, FetchPollInterval 1 s).
const (
	riverBenchFetchCooldown     = 2 * time.Millisecond
	riverBenchFetchPollInterval = 20 * time.Millisecond
	riverBenchMaxWorkers        = 2_000
)

// riverConfig is how riverRun configures each of its clients.
type riverConfig int

const (
	// riverDefault: MaxWorkers riverPerWorker, default fetch settings (the
	// configuration earlier reports measured).
	riverDefault riverConfig = iota
	// riverTuned: configured as `river bench` configures its client.
	riverTuned
	// riverScheduled: default settings, every job inserted as scheduled
	// (ScheduledAt a second in the past), as a reminder is stored before it
	// is due: River's scheduler then moves them to available, as Nudge's
	// dispatcher claims its due rows, and the run pays for that.
	riverScheduled
	// riverTunedSMS: tuned, and each job sends an SMS as Nudge's e2e run
	// does: the same client (sms.New's default, fakeSMS) to the same fake
	// provider in a process of its own, the same message. The no-op jobs
	// measure River's queue alone; Nudge's HTTP row also pays for the
	// provider's round trip (its client side in the harness, its server
	// side in the fake's process), so this row is the same work on both
	// sides, as the in-process sink row is for the no-op jobs.
	riverTunedSMS
)

func (c riverConfig) String() string {
	switch c {
	case riverTuned:
		return "river tuned as river bench"
	case riverScheduled:
		return "river, jobs inserted as scheduled"
	case riverTunedSMS:
		return "river tuned, each job sending an SMS"
	}
	return "river"
}

// clientConfig is the river.Config of one client of a run.
func (c riverConfig) clientConfig(schema string, workers *river.Workers, logger *slog.Logger, id string) *river.Config {
	cfg := &river.Config{
		Schema: schema, Workers: workers, Logger: logger,
		Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: riverPerWorker}},
		ID:     id,
	}
	if c == riverTuned || c == riverTunedSMS {
		cfg.FetchCooldown = riverBenchFetchCooldown
		cfg.FetchPollInterval = riverBenchFetchPollInterval
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: riverBenchMaxWorkers}}
	}
	return cfg
}

// riverRun inserts n no-op jobs with InsertMany into a schema of its own,
// then starts k River clients (each with its own pool, configured as cfg
// says) and measures from the first attempt to the last completion
// (attempted_at, finalized_at); with riverScheduled, from the clients' start
// (the scheduler's moves come before the first attempt).
func riverRun(ctx context.Context, e *env, n, k int, cfg riverConfig) (riverResult, error) {
	var res riverResult
	name, drop, err := e.newSchema(ctx, "bench_river")
	if err != nil {
		return res, err
	}
	defer drop()
	url := e.schemaURL(name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	mig, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: name})
	if err != nil {
		return res, err
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return res, fmt.Errorf("river migrate: %w", err)
	}
	workers := river.NewWorkers()
	var worked atomic.Int64
	if cfg == riverTunedSMS {
		client, stop, err := fakeSMS(&worked)
		if err != nil {
			return res, err
		}
		defer stop()
		river.AddWorker(workers, &smsJobWorker{sender: client})
	} else {
		river.AddWorker(workers, noopWorker{worked: &worked})
	}
	quiet := slog.New(slog.DiscardHandler)
	// The warm-up (-warmup): not for jobs inserted as scheduled, whose window
	// starts with the clients' start as it did before: with clients already
	// running, the window would open at a random moment of the leader's
	// scheduler interval (5 s), a wait that is River's timing, not its work.
	warm := warmup
	var scheduledAt *time.Time
	if cfg == riverScheduled {
		at := time.Now().Add(-time.Second)
		scheduledAt = &at
		warm = 0
	}
	tmpl, err := riverSeedTemplate(ctx, e, max(n, warm*k))
	if err != nil {
		return res, err
	}
	copyJobs := func(m int, queue string, at *time.Time) error {
		q := fmt.Sprintf(stmt("RiverSeedCopy"), pgx.Identifier{tmpl}.Sanitize())
		if _, err := pool.Exec(ctx, q, pgx.NamedArgs{"n": m, "queue": queue, "scheduled_at": at}); err != nil {
			return fmt.Errorf("copying River's jobs from %s: %w", tmpl, err)
		}
		return nil
	}
	if err := copyJobs(n, river.QueueDefault, scheduledAt); err != nil {
		return res, err
	}
	// The warm-up's jobs (-warmup per client), in a queue of their own that
	// the clients work before the measured default queue is added to them.
	if warm > 0 {
		if err := copyJobs(warm*k, riverWarmupQueue, nil); err != nil {
			return res, err
		}
	}

	var clients []*river.Client[pgx.Tx]
	var pools []*pgxpool.Pool
	defer func() {
		for _, c := range clients {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_ = c.Stop(sctx)
			cancel()
		}
		for _, p := range pools {
			p.Close()
		}
	}()
	start := func() error {
		for i := range k {
			p, err := pgxpool.New(ctx, url)
			if err != nil {
				return err
			}
			pools = append(pools, p)
			ccfg := cfg.clientConfig(name, workers, quiet, fmt.Sprintf("nudge-bench-river-%d", i))
			if warm > 0 {
				ccfg.Queues = map[string]river.QueueConfig{riverWarmupQueue: ccfg.Queues[river.QueueDefault]}
			}
			c, err := river.NewClient(riverpgxv5.New(p), ccfg)
			if err != nil {
				return err
			}
			if err := c.Start(ctx); err != nil {
				return err
			}
			clients = append(clients, c)
		}
		return nil
	}
	measured := pgx.NamedArgs{"queue": river.QueueDefault}
	if warm > 0 {
		if err := riverWarmUp(ctx, pool, start, &worked, warm*k); err != nil {
			return res, err
		}
		for _, c := range clients {
			if err := c.Queues().Remove(ctx, riverWarmupQueue); err != nil {
				return res, err
			}
		}
		worked.Store(0)
	}
	wal0, err := walStart(ctx, pool)
	if err != nil {
		return res, err
	}
	resetPeakRSS()
	cpu0 := readCPU()
	started := time.Now()
	if warm == 0 {
		if err := start(); err != nil {
			return res, err
		}
	} else {
		for _, c := range clients {
			qc := cfg.clientConfig(name, workers, quiet, "").Queues[river.QueueDefault]
			if err := c.Queues().Add(river.QueueDefault, qc); err != nil {
				return res, err
			}
		}
	}
	timeout := time.After(10 * time.Minute)
	var polled time.Time
	done := 0
	for {
		if pollDB(&worked, n, polled) {
			polled = time.Now()
			if err := pool.QueryRow(ctx, stmt("RiverCompleted"), measured).Scan(&done); err != nil {
				return res, err
			}
			if done >= n {
				break
			}
		}
		select {
		case <-timeout:
			return res, fmt.Errorf("%s: only %d of %d jobs completed after 10 minutes", cfg, done, n)
		case <-time.After(50 * time.Millisecond):
		}
	}
	e.measuredSince(started)
	res.CPU = readCPU().sub(cpu0)
	res.RSS = peakRSSMiB()
	if res.WAL, err = wal0.since(ctx, pool); err != nil {
		return res, err
	}
	var first, last time.Time
	if err := pool.QueryRow(ctx, stmt("RiverSpan"), measured).Scan(&first, &last); err != nil {
		return res, err
	}
	if cfg == riverScheduled {
		first = started
	}
	res.Elapsed = last.Sub(first)
	res.Rate = float64(n) / res.Elapsed.Seconds()
	return res, nil
}

// riverSeed is the template schema every River run copies its jobs from
// (RiverSeedCopy): jobs inserted with InsertMany once per run of the
// harness, not once per River run (nine inserts of 100,000 jobs and more in
// make bench, each seconds of the machine the runs share). The run drops it
// at its end (dropSeedTemplates).
var riverSeed struct {
	schema string
	jobs   int
	pool   *pgxpool.Pool
	drop   func()
}

// riverSeedTemplate is the schema of River's template, holding at least m
// no-op jobs (the i-th with N = i, in the default queue), inserted as the
// runs inserted them before they copied them: InsertMany in chunks of 2,000,
// two inserting at once, as the intake seeds Nudge's runs (setupNudge).
func riverSeedTemplate(ctx context.Context, e *env, m int) (string, error) {
	if riverSeed.pool == nil {
		name, drop, err := e.newSchema(ctx, "bench_river_seed")
		if err != nil {
			return "", err
		}
		pool, err := pgxpool.New(ctx, e.schemaURL(name))
		if err != nil {
			drop()
			return "", err
		}
		mig, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Schema: name})
		if err == nil {
			_, err = mig.Migrate(ctx, rivermigrate.DirectionUp, nil)
		}
		if err != nil {
			pool.Close()
			drop()
			return "", fmt.Errorf("river migrate: %w", err)
		}
		riverSeed.schema, riverSeed.pool, riverSeed.drop = name, pool, func() { pool.Close(); drop() }
	}
	if riverSeed.jobs >= m {
		return riverSeed.schema, nil
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{worked: new(atomic.Int64)})
	inserter, err := river.NewClient(riverpgxv5.New(riverSeed.pool), &river.Config{Schema: riverSeed.schema, Workers: workers, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return "", err
	}
	const chunk = 2000
	var jobs []func(*pgxpool.Conn) error
	for off := riverSeed.jobs; off < m; off += chunk {
		jobs = append(jobs, func(*pgxpool.Conn) error {
			params := make([]river.InsertManyParams, 0, chunk)
			for i := off; i < min(off+chunk, m); i++ {
				params = append(params, river.InsertManyParams{Args: noopArgs{N: i}})
			}
			if _, err := inserter.InsertMany(ctx, params); err != nil {
				return fmt.Errorf("river insert: %w", err)
			}
			return nil
		})
	}
	if err := inParallel(ctx, riverSeed.pool, 2, jobs); err != nil {
		return "", err
	}
	riverSeed.jobs = m
	return riverSeed.schema, nil
}

// riverWarmupQueue holds a run's warm-up jobs (-warmup).
const riverWarmupQueue = "warmup"

// riverWarmUp starts the clients (start), which work only the warm-up queue,
// waits until its m jobs are completed, and stops the clients working it.
// It asks the database as the measured runs do (pollDB, on the count of
// Work calls): a count over every job of the table every 50 ms took a share
// of the cores the warm-up runs on.
func riverWarmUp(ctx context.Context, pool *pgxpool.Pool, start func() error, worked *atomic.Int64, m int) error {
	if err := start(); err != nil {
		return err
	}
	var polled time.Time
	for limit := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if !pollDB(worked, m, polled) {
			continue
		}
		polled = time.Now()
		var done int
		if err := pool.QueryRow(ctx, stmt("RiverCompleted"), pgx.NamedArgs{"queue": riverWarmupQueue}).Scan(&done); err != nil {
			return err
		}
		if done >= m {
			return nil
		}
		if time.Now().After(limit) {
			return fmt.Errorf("river warm-up: only %d of %d jobs completed after 2 minutes", done, m)
		}
	}
}
