package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

const signingKeys = "bench:nudge-bench-signing-secret-0123456789"

// nudgeSetup is a migrated schema holding n SMS reminders and a topology of
// its own; cleanup drops both.
type nudgeSetup struct {
	schema  string
	url     string
	pool    *pgxpool.Pool
	topo    broker.Topology
	cleanup func()
}

// dueFunc gives the i-th seeded reminder its due time and deadline.
type dueFunc func(i int) (due, deadline time.Time)

// dueNow makes every reminder due a minute ago, with two hours to go.
func dueNow() dueFunc {
	now := time.Now()
	return func(int) (time.Time, time.Time) { return now.Add(-time.Minute), now.Add(2 * time.Hour) }
}

// seedTemplates are the schemas the intake seeded once per N for the runs
// whose reminders are all due now (setupNudge with no dueFunc): later runs
// of that N copy their rows (SeedCopy) instead of scheduling them again,
// which costs the intake's per-row work (about 0.05 CPU-s per 1,000, 12 s
// and more of wall time per 100,000 on the bench machine) six times a run
// of make bench. The run drops them at its end (dropSeedTemplates).
var seedTemplates = map[int]*nudgeSetup{}

// warmTemplates are the templates of the warm-ups (-warmup × workers
// reminders, numbered from warmIDBase, keys "bench-warmup:<i>"), seeded
// through the intake once per size and copied into every end-to-end run
// (warmUp), as seedTemplates are: make bench ran 105,000 warm-up reminders
// through the intake, 35,000 a run, before it copied them.
var warmTemplates = map[int]*nudgeSetup{}

// dropSeedTemplates drops the seeding templates.
func dropSeedTemplates() {
	for n, t := range seedTemplates {
		t.cleanup()
		delete(seedTemplates, n)
	}
	for m, t := range warmTemplates {
		t.cleanup()
		delete(warmTemplates, m)
	}
	if riverSeed.drop != nil {
		riverSeed.drop()
		riverSeed.drop, riverSeed.pool, riverSeed.jobs = nil, nil, 0
	}
}

// setupNudge migrates a schema of its own, declares a topology of its own
// and schedules n SMS reminders through the intake (intake.ScheduleMany),
// due as due says; with no dueFunc, every one due a minute ago (dueNow),
// copied from the template of that n, which the intake seeds on first use.
func setupNudge(ctx context.Context, e *env, n int, due dueFunc) (*nudgeSetup, error) {
	if due == nil {
		tmpl, err := seedTemplate(ctx, e, n)
		if err != nil {
			return nil, err
		}
		return setupNudgeSchema(ctx, e, n, nil, tmpl)
	}
	return setupNudgeSchema(ctx, e, n, due, "")
}

// seedTemplate is the schema of the template of n reminders due now,
// seeded on first use.
func seedTemplate(ctx context.Context, e *env, n int) (string, error) {
	return templateOf(ctx, e, seedTemplates, n, "bench", 0)
}

// warmTemplate is the schema of the template of a warm-up of m reminders,
// seeded on first use.
func warmTemplate(ctx context.Context, e *env, m int) (string, error) {
	return templateOf(ctx, e, warmTemplates, m, "bench-warmup", warmIDBase)
}

// templateOf is the schema of cache's template of n reminders due now, with
// keys "<key>:<i>" and numbered from base (0: where the identities start),
// seeded through the intake on first use.
func templateOf(ctx context.Context, e *env, cache map[int]*nudgeSetup, n int, key string, base int64) (string, error) {
	if tmpl, ok := cache[n]; ok {
		return tmpl.schema, nil
	}
	tmpl, err := newTemplate(ctx, e)
	if err != nil {
		return "", err
	}
	if base > 0 {
		if _, err := tmpl.pool.Exec(ctx, stmt("WarmupIDs"), pgx.NamedArgs{"base": base}); err != nil {
			tmpl.cleanup()
			return "", fmt.Errorf("numbering the template's reminders: %w", err)
		}
	}
	if err := tmpl.schedule(ctx, n, dueNow(), key); err != nil {
		tmpl.cleanup()
		return "", err
	}
	cache[n] = tmpl
	return tmpl.schema, nil
}

// newTemplate migrates a schema of its own for a template (seedTemplate,
// warmTemplate), which nothing dispatches from: no topology is declared for
// it (declaring and deleting a topology's quorum queues took 2–2.5 s of the
// broker's and the machine's time per schema, load 7–9).
func newTemplate(ctx context.Context, e *env) (*nudgeSetup, error) {
	return migratedSchema(ctx, e, "bench_seed")
}

// migratedSchema is a new schema named after prefix, migrated, with a pool;
// its cleanup closes the pool and drops the schema.
func migratedSchema(ctx context.Context, e *env, prefix string) (*nudgeSetup, error) {
	name, drop, err := e.newSchema(ctx, prefix)
	if err != nil {
		return nil, err
	}
	s := &nudgeSetup{url: e.schemaURL(name), schema: name}
	s.cleanup = func() {
		if s.pool != nil {
			s.pool.Close()
		}
		drop()
	}
	if s.pool, err = pgxpool.New(ctx, s.url); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("connecting to schema %s: %w", name, err)
	}
	if _, err := migrate(ctx, s.pool); err != nil {
		s.cleanup()
		return nil, fmt.Errorf("migrating %s: %w", name, err)
	}
	return s, nil
}

// setupNudgeSchema is setupNudge: with due nil, copying the reminders of
// the schema named from (none when from is empty); otherwise scheduling
// them.
func setupNudgeSchema(ctx context.Context, e *env, n int, due dueFunc, from string) (*nudgeSetup, error) {
	s, err := migratedSchema(ctx, e, "bench_nudge")
	if err != nil {
		return nil, err
	}
	topo := broker.Topology{Prefix: "nudge-bench-" + testenv.RandomID()}.WithDefaults()
	s.topo = topo
	dropSchema := s.cleanup
	s.cleanup = func() {
		if conn, err := broker.Dial(e.amqpURL, "nudge-bench-cleanup"); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_ = topo.Delete(ch)
			}
			conn.Close()
		}
		dropSchema()
	}
	fail := func(err error) (*nudgeSetup, error) { s.cleanup(); return nil, err }
	conn, err := broker.Dial(e.amqpURL, "nudge-bench-declare")
	if err != nil {
		return fail(fmt.Errorf("connecting to RabbitMQ: %w", err))
	}
	ch, err := conn.Channel()
	if err == nil {
		err = topo.Declare(ch)
	}
	conn.Close()
	if err != nil {
		return fail(fmt.Errorf("declaring topology %s: %w", topo.Prefix, err))
	}
	if due == nil {
		if from != "" {
			if err := s.copyFrom(ctx, from); err != nil {
				return fail(err)
			}
		}
		return s, nil
	}
	if err := s.schedule(ctx, n, due, "bench"); err != nil {
		return fail(err)
	}
	return s, nil
}

// copyFrom copies the reminders of the template schema named from (SeedCopy).
func (s *nudgeSetup) copyFrom(ctx context.Context, from string) error {
	q := fmt.Sprintf(stmt("SeedCopy"), pgx.Identifier{from}.Sanitize())
	if _, err := s.pool.Exec(ctx, q, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("copying the seeded reminders of %s: %w", from, err)
	}
	return nil
}

// schedule schedules n SMS reminders through the intake, due as due says,
// with idempotency keys "<key>:<i>".
func (s *nudgeSetup) schedule(ctx context.Context, n int, due dueFunc, key string) error {
	// Seeding is the intake's bulk statement, chunk by chunk, over two
	// connections at once: PostgreSQL's side of it is the work, and one
	// connection would leave one of the two cores idle.
	const chunk = 2000
	var jobs []func(*pgxpool.Conn) error
	for off := 0; off < n; off += chunk {
		jobs = append(jobs, func(c *pgxpool.Conn) error {
			reqs := make([]intake.Request, 0, chunk)
			for i := off; i < min(off+chunk, n); i++ {
				dueAt, deadline := due(i)
				reqs = append(reqs, intake.Request{
					Tenant: fmt.Sprintf("tenant-%d", i%4), Key: fmt.Sprintf("%s:%d", key, i), Channel: reminder.SMS,
					Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
					Data: map[string]any{"course": "Go 101"}, DueAt: dueAt, Deadline: deadline,
				})
			}
			out, err := intake.ScheduleMany(ctx, c, reqs)
			if err != nil {
				return fmt.Errorf("seeding: %w", err)
			}
			for _, o := range out {
				if o.Err != nil {
					return fmt.Errorf("seeding: %w", o.Err)
				}
			}
			return nil
		})
	}
	return inParallel(ctx, s.pool, 2, jobs)
}

// warmup is -warmup: the reminders (River: jobs) per worker that go through
// every end-to-end run before its clock starts, so that the measured window
// holds the steady state and no connection's start. A connection's first
// statements cost PostgreSQL about 70 ms of CPU (its backend, catalog
// caches, the statements' preparation and first custom plans), paid by every
// connection of every worker: at 4 workers and N = 10,000, 16 connections'
// starts were over a quarter of the run's CPU. 2,000 per worker gives each of its
// 4 connections ~10 batches of 50 before the clock, past the 5 custom plans
// PostgreSQL makes of each statement (5,000 until 2026-12-02: ~135,000
// reminders and River jobs of warm-up per make bench, about 50 s of its
// wall time). 0: none (every run starts cold).
var warmup = 2000

// warmIDBase numbers the warm-up's reminders and events, above the measured
// ones; the run's statements count only those below it.
const warmIDBase = 1_000_000_000

// belowWarm names, for the harness's statements, the measured reminders.
var belowWarm = pgx.NamedArgs{"below": warmIDBase}

// warmUp runs m reminders, numbered from warmIDBase (copied from their
// template, warmTemplate), through the dispatcher d and the started
// workers, and returns once every one is terminal, asking the database as
// the measured runs do (pollDB, on the workers' count of sends).
func (s *nudgeSetup) warmUp(ctx context.Context, e *env, d *dispatch.Dispatcher, sent *atomic.Int64, m int) error {
	tmpl, err := warmTemplate(ctx, e, m)
	if err != nil {
		return err
	}
	if err := s.copyFrom(ctx, tmpl); err != nil {
		return err
	}
	if _, err := dispatchUntilDone(ctx, d); err != nil {
		return fmt.Errorf("warm-up dispatcher: %w", err)
	}
	var polled time.Time
	for limit := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if !pollDB(sent, m, polled) {
			continue
		}
		polled = time.Now()
		var done int
		if err := s.pool.QueryRow(ctx, stmt("WarmupTerminal"), belowWarm).Scan(&done); err != nil {
			return err
		}
		if done >= m {
			return nil
		}
		if time.Now().After(limit) {
			return fmt.Errorf("warm-up: only %d of %d reminders terminal after 2 minutes", done, m)
		}
	}
}

// envelopeSize is the dispatchers' dispatch.Config.EnvelopeSize (-envelope-size):
// reminders per broker message.
var envelopeSize = 50

// burstEnvelopeSize is their dispatch.Config.BurstEnvelopeSize
// (-burst-envelope-size): reminders per message while a pass claims full
// batches, as every pass over a backlog does; 0, the product's default: 100,
// or 1 at envelope size 1.
var burstEnvelopeSize = 0

// dispatchConfig is a dispatcher's configuration at envelope size envelope:
// a message per reminder throughout at 1 (the dispatcher-alone section's
// second row), else -burst-envelope-size in bursts.
func dispatchConfig(envelope int) dispatch.Config {
	if envelope == 1 {
		return dispatch.Config{EnvelopeSize: 1, BurstEnvelopeSize: 1}
	}
	return dispatch.Config{EnvelopeSize: envelope, BurstEnvelopeSize: burstEnvelopeSize}
}

// envelopes says which envelope sizes a dispatcher at envelope size
// envelope ran, for the report: "50, 100 in a burst".
func envelopes(envelope int) string {
	c := dispatchConfig(envelope).WithDefaults()
	return fmt.Sprintf("%d, %d in a burst", c.EnvelopeSize, c.BurstEnvelopeSize)
}

func (s *nudgeSetup) dispatcher(e *env, keys *message.Keyring, m *metrics.Metrics) (*dispatch.Dispatcher, *broker.Publisher) {
	return s.dispatcherSized(e, keys, m, envelopeSize)
}

func (s *nudgeSetup) dispatcherSized(e *env, keys *message.Keyring, m *metrics.Metrics, envelope int) (*dispatch.Dispatcher, *broker.Publisher) {
	pub := broker.NewPublisher(e.amqpURL, s.topo, "nudge-bench-dispatcher")
	return &dispatch.Dispatcher{
		Config: dispatchConfig(envelope),
		Enqueuer: dispatch.Enqueuer{
			Store: store.New(s.pool), Publisher: pub, Keys: keys, Topology: s.topo,
			Clock: clock.Real{}, Actor: "bench-dispatcher", Metrics: m,
		},
		Log: zerolog.Nop(),
	}, pub
}

// dispatchResult is one run of the dispatcher alone.
type dispatchResult struct {
	Rate    float64
	Batches int
	RSS     float64
}

// dispatcherAlone runs one dispatcher pass over n due reminders with no
// worker consuming: claim + publish (confirms) + record the publish
// confirmations, envelope reminders per message.
func dispatcherAlone(ctx context.Context, e *env, n, envelope int) (dispatchResult, error) {
	var res dispatchResult
	s, err := setupNudge(ctx, e, n, nil)
	if err != nil {
		return res, err
	}
	defer s.cleanup()
	keys, err := message.ParseKeys(signingKeys)
	if err != nil {
		return res, err
	}
	d, pub := s.dispatcherSized(e, keys, nil, envelope)
	defer pub.Close()
	resetPeakRSS()
	t0 := time.Now()
	sum, err := d.RunOnce(ctx)
	e.measuredSince(t0)
	res.RSS = peakRSSMiB()
	if err != nil {
		return res, err
	}
	if sum.Enqueued != n {
		return res, fmt.Errorf("dispatcher enqueued %d of %d (%+v)", sum.Enqueued, n, sum)
	}
	res.Rate = float64(sum.Enqueued) / sum.Elapsed.Seconds()
	res.Batches = sum.Batches
	return res, nil
}

// fakeSMS starts an instant fake SMS provider in a process of its own
// (startFakeProvider) and returns the real SMS client pointed at it,
// counting its sends into sent.
func fakeSMS(sent *atomic.Int64) (countedSMS, func(), error) {
	fp, err := startFakeProvider()
	if err != nil {
		return countedSMS{}, nil, err
	}
	// sms.New's default client, as the sms-worker binary wires it (its
	// pooled connections close after 30 s idle, or with the provider): its
	// timeout is the worker's send timeout, so provider.WithTimeout finds
	// the worker's own deadline and adds no timer to a send (10 s here
	// before made one per send that the binary does not).
	sender, err := sms.New(sms.Config{URL: fp.URL, Timeout: worker.Config{}.WithDefaults().SendTimeout})
	if err != nil {
		fp.stop()
		return countedSMS{}, nil, fmt.Errorf("SMS client: %w", err)
	}
	return countedSMS{sender, sent}, func() { fp.stop() }, nil
}

// countedSMS is the real SMS client (every method of it: the worker asks a
// sender for more than Send) with its sends counted.
type countedSMS struct {
	*sms.Client
	sent *atomic.Int64
}

func (c countedSMS) Send(ctx context.Context, msg provider.Message) (string, error) {
	id, err := c.Client.Send(ctx, msg)
	c.sent.Add(1)
	return id, err
}

// pollDB says whether a run's progress loop should ask the database again:
// every time once the run's own count of sends (or of River's Work calls)
// reached n, otherwise every 5 seconds (a run whose reminders do not all
// reach the provider still ends). The progress statements count the whole
// table (up to n rows, tens of milliseconds of the server's CPU each):
// asked every 50 ms throughout, they took a share of the 2 cores from the
// system they measure, and the PostgreSQL column counted them.
func pollDB(sent *atomic.Int64, n int, last time.Time) bool {
	return sent.Load() >= int64(n) || time.Since(last) >= 5*time.Second
}

// sinkSender is the in-process provider the issue allows "for the ceiling":
// it accepts at once, with no HTTP hop, like River's no-op worker.
type sinkSender struct{ sent *atomic.Int64 }

func (s sinkSender) Send(_ context.Context, msg provider.Message) (string, error) {
	s.sent.Add(1)
	return "sink-" + strconv.FormatInt(msg.ReminderID, 10), nil
}

// startWorkers runs k SMS workers in this process (default configuration,
// each with its own PostgreSQL pool and broker connections) and returns once
// every one consumes; stop drains and closes them.
func (s *nudgeSetup) startWorkers(ctx context.Context, e *env, keys *message.Keyring, sender provider.Sender, k int, m *metrics.Metrics) (stop func(), err error) {
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	var workers []*worker.Worker
	var pools []*pgxpool.Pool
	stop = func() {
		cancel()
		wg.Wait()
		for _, p := range pools {
			p.Close()
		}
	}
	for i := range k {
		p, err := pgxpool.New(ctx, s.url)
		if err != nil {
			stop()
			return nil, fmt.Errorf("worker pool: %w", err)
		}
		pools = append(pools, p)
		w, err := worker.New(worker.Config{Channel: reminder.SMS, Name: fmt.Sprintf("bench-sms-worker-%d", i)},
			worker.Deps{AMQPURL: e.amqpURL, Topology: s.topo, Store: store.New(p), Sender: sender,
				Keys: keys, Clock: clock.Real{}, Log: zerolog.Nop(), Metrics: m})
		if err != nil {
			stop()
			return nil, fmt.Errorf("worker: %w", err)
		}
		workers = append(workers, w)
		wg.Go(func() { _ = w.Run(wctx) })
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		ready := true
		for _, w := range workers {
			ready = ready && w.Ready()
		}
		if ready {
			return stop, nil
		}
		if time.Now().After(deadline) {
			stop()
			return nil, errors.New("workers not ready after 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// e2eResult is one end-to-end run.
type e2eResult struct {
	Rate      float64 // reminders/s, first claim to last terminal state
	Elapsed   time.Duration
	Delivered int
	CPU       cpuTicks // CPU seconds spent during the run, by owner
	WAL       walUsage // the WAL written during the run
	RSS       float64  // peak RSS of the harness process during the run, MiB
	// Claim-to-terminal latency under saturation (ms), from the event trail.
	P50, P99, Max float64
	// FailedPasses are the errors of dispatcher passes that failed and were
	// run again (see dispatchUntilDone).
	FailedPasses []string
}

// maxPasses bounds the dispatcher passes of one run.
const maxPasses = 5

// dispatchUntilDone runs dispatcher passes until one succeeds, as the
// dispatcher's loop (or its CronJob) would at its next tick: a failed pass
// leaves its rows enqueued (their messages, if published, are still worked)
// and the rest pending for the next pass. It returns the failed passes'
// errors, and an error once maxPasses have failed.
func dispatchUntilDone(ctx context.Context, d *dispatch.Dispatcher) ([]string, error) {
	var failed []string
	for range maxPasses {
		_, err := d.RunOnce(ctx)
		if err == nil || ctx.Err() != nil {
			return failed, err
		}
		failed = append(failed, err.Error())
	}
	return failed, fmt.Errorf("%d dispatcher passes failed, the last with: %s", maxPasses, failed[len(failed)-1])
}

// nudgeE2E runs n reminders through one dispatcher pass and k workers,
// sending to the fake SMS provider over HTTP, or with sink to an in-process
// sink (no HTTP hop: the like-for-like comparison with River's no-op jobs).
// nudgeE2E runs n reminders through k workers; with storage set it then
// measures what they occupy over the retention windows (measureStorage).
func nudgeE2E(ctx context.Context, e *env, n, k int, profile string, sink bool, storage *storageResult) (e2eResult, error) {
	var res e2eResult
	tmpl, err := seedTemplate(ctx, e, n)
	if err != nil {
		return res, err
	}
	from := tmpl
	if warmup > 0 {
		from = "" // copied after the warm-up
	}
	s, err := setupNudgeSchema(ctx, e, n, nil, from)
	if err != nil {
		return res, err
	}
	defer s.cleanup()
	keys, err := message.ParseKeys(signingKeys)
	if err != nil {
		return res, err
	}
	var sent atomic.Int64
	var sender provider.Sender = sinkSender{&sent}
	if !sink {
		client, closeSink, err := fakeSMS(&sent)
		if err != nil {
			return res, err
		}
		defer closeSink()
		sender = client
	}
	stopWorkers, err := s.startWorkers(ctx, e, keys, sender, k, nil)
	if err != nil {
		return res, err
	}
	defer stopWorkers()

	d, pub := s.dispatcher(e, keys, nil)
	defer pub.Close()
	if warmup > 0 {
		if err := s.warmUp(ctx, e, d, &sent, warmup*k); err != nil {
			return res, err
		}
		if err := s.copyFrom(ctx, tmpl); err != nil {
			return res, err
		}
		sent.Store(0) // pollDB counts the measured sends
	}
	if profile != "" {
		f, err := os.Create(profile)
		if err != nil {
			return res, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return res, err
		}
		defer pprof.StopCPUProfile()
	}
	wal0, err := walStart(ctx, s.pool)
	if err != nil {
		return res, err
	}
	walRead := false
	defer func() {
		if !walRead {
			// A run that fails before reading its WAL: the slot's
			// connection is still out, and closing the pool would wait
			// for it forever.
			wal0.release()
		}
	}()
	resetPeakRSS()
	cpu0 := readCPU()
	dispErr := make(chan error, 1)
	var failedPasses []string // written before dispErr is sent
	go func() {
		var err error
		failedPasses, err = dispatchUntilDone(ctx, d)
		dispErr <- err
	}()

	timeStarted := time.Now()
	var polled time.Time
	for {
		if pollDB(&sent, n, polled) {
			polled = time.Now()
			var done int
			if err := s.pool.QueryRow(ctx, stmt("TerminalCount"), belowWarm).Scan(&done); err != nil {
				return res, err
			}
			if done >= n {
				break
			}
			if time.Since(timeStarted) > 10*time.Minute {
				return res, fmt.Errorf("only %d of %d reminders terminal after 10 minutes", done, n)
			}
		}
		select {
		case err := <-dispErr:
			if err != nil {
				return res, fmt.Errorf("dispatcher: %w", err)
			}
			dispErr = nil
		case <-time.After(50 * time.Millisecond):
		}
	}
	e.measuredSince(timeStarted)
	res.CPU = readCPU().sub(cpu0)
	res.RSS = peakRSSMiB()
	walRead = true
	if res.WAL, err = wal0.since(ctx, s.pool); err != nil {
		return res, err
	}
	if profile != "" {
		pprof.StopCPUProfile()
	}
	if dispErr != nil {
		if err := <-dispErr; err != nil {
			return res, fmt.Errorf("dispatcher: %w", err)
		}
	}
	res.FailedPasses = failedPasses

	var first, last time.Time
	if err := s.pool.QueryRow(ctx, stmt("E2ESpan"), belowWarm).Scan(&first, &last); err != nil {
		return res, err
	}
	if err := s.pool.QueryRow(ctx, stmt("DeliveredCount"), belowWarm).Scan(&res.Delivered); err != nil {
		return res, err
	}
	res.Elapsed = last.Sub(first)
	res.Rate = float64(n) / res.Elapsed.Seconds()
	if err = s.pool.QueryRow(ctx, stmt("ClaimToTerminal"), belowWarm).Scan(&res.P50, &res.P99, &res.Max); err != nil || storage == nil {
		return res, err
	}
	// The warm-up's reminders were delivered as the measured ones were:
	// what the tables hold is shared among them all.
	*storage, err = measureStorage(ctx, s, n+warmup*k)
	return res, err
}
