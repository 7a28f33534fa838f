package worker_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/fakesms"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// BenchmarkPipeline runs N due SMS reminders (NUDGE_BENCH_N, default 20,000,
// four tenants) through one dispatcher pass and NUDGE_BENCH_WORKERS (default
// 2) in-process workers in their default configuration, as make bench does,
// and reports where the cost goes: the rate (first claim to last terminal
// event), CPU per 1,000 reminders of this process and of the PostgreSQL
// backends serving it (found by application_name), round trips per reminder
// and client-side time per statement, WAL per reminder (the server's whole
// WAL, so noisy on a shared server) and deadlocks. Run it once per variant:
//
//	go test ./internal/worker -run '^$' -bench Pipeline -benchtime 1x -v
//
// NUDGE_BENCH_ENVELOPE sets the dispatcher's EnvelopeSize (default 1:
// a message per reminder), NUDGE_BENCH_BURST its BurstEnvelopeSize (default:
// the product's, 200, or 1 at envelope 1; the pass claims full batches, so
// all but its last claim are a burst); the broker messages the dispatcher published per
// reminder and the RabbitMQ node's CPU (its beam.smp on this host, shared
// with whatever else uses the node) are reported beside the rest.
// NUDGE_BENCH_SENDER=nop replaces the HTTP hop to the fake provider with an
// in-process sink; NUDGE_BENCH_CPUPROFILE=FILE writes a CPU profile of the
// measured window only (seeding excluded). NUDGE_BENCH_WARMUP=W first runs W
// reminders per worker through the pipeline, outside the measured window.
func BenchmarkPipeline(b *testing.B) {
	n := envInt("NUDGE_BENCH_N", 20000)
	k := envInt("NUDGE_BENCH_WORKERS", 2)
	for range b.N {
		runPipeline(b, n, k)
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// stmtStat is what the tracer saw of one statement.
type stmtStat struct {
	calls, prepares int64
	dur             time.Duration
}

// tracer counts round trips and client-side time per statement.
type tracer struct {
	mu sync.Mutex
	m  map[string]*stmtStat
}

type traceKey struct{}

type traceStart struct {
	name string
	at   time.Time
}

// stmtName names a statement from its SQL.
func stmtName(sql string) string {
	for _, c := range []struct{ sub, name string }{
		{"WITH RECURSIVE tenants", "ClaimDue"},
		{"INSERT INTO publish_confirms", "ConfirmPublished"},
		{"r.template, r.data", "ClaimForDelivery"},
		{"INSERT INTO delivery_attempts", "ClaimAttempts"},
		{"o(id, fence, attempt_id", "RecordOutcomes"},
		{"nudge_rate_reserve", "RateReserve"},
		{"SET state = 'expired'", "Expire*"},
		{"WHERE id = ANY", "LoadForDelivery"},
	} {
		if strings.Contains(sql, c.sub) {
			return c.name
		}
	}
	s := strings.Join(strings.Fields(sql), " ")
	return s[:min(len(s), 50)]
}

func (t *tracer) stat(name string) *stmtStat {
	s := t.m[name]
	if s == nil {
		s = &stmtStat{}
		t.m[name] = s
	}
	return s
}

func (t *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, traceKey{}, traceStart{stmtName(d.SQL), time.Now()})
}

func (t *tracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	st, ok := ctx.Value(traceKey{}).(traceStart)
	if !ok {
		return
	}
	t.mu.Lock()
	s := t.stat(st.name)
	s.calls++
	s.dur += time.Since(st.at)
	t.mu.Unlock()
}

func (t *tracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, d pgx.TracePrepareStartData) context.Context {
	t.mu.Lock()
	t.stat(stmtName(d.SQL)).prepares++
	t.mu.Unlock()
	return ctx
}

func (t *tracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (t *tracer) reset() {
	t.mu.Lock()
	t.m = map[string]*stmtStat{}
	t.mu.Unlock()
}

// procCPU is the user+system CPU time of a process, from /proc.
func procCPU(pid int) time.Duration { return testenv.ProcCPU(pid) }

// selfWrites is how many write syscalls this process made, from /proc.
func selfWrites() int64 {
	raw, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// nopSender accepts every message at once.
type nopSender struct{}

func (nopSender) Send(_ context.Context, m provider.Message) (string, error) {
	return "nop-" + strconv.FormatInt(m.ReminderID, 10), nil
}

func runPipeline(b *testing.B, n, k int) {
	ctx := context.Background()
	db := testenv.Postgres(b)
	mq := testenv.RabbitMQ(b)
	topo := mq.Topology
	app := "nudgeprof-" + testenv.RandomID()
	tr := &tracer{m: map[string]*stmtStat{}}
	newPool := func() *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(db.URL)
		if err != nil {
			b.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.ConnConfig.Tracer = tr
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(p.Close)
		return p
	}

	// seed schedules the reminders [from, to), due a minute ago.
	seed := func(from, to int) {
		const chunk = 2000
		due, deadline := time.Now().Add(-time.Minute), time.Now().Add(2*time.Hour)
		for off := from; off < to; off += chunk {
			reqs := make([]intake.Request, 0, chunk)
			for i := off; i < min(off+chunk, to); i++ {
				reqs = append(reqs, intake.Request{
					Tenant: fmt.Sprintf("tenant-%d", i%4), Key: fmt.Sprintf("bench:%d", i), Channel: reminder.SMS,
					Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
					Data: map[string]any{"course": "Go 101"}, DueAt: due, Deadline: deadline,
				})
			}
			out, err := intake.ScheduleMany(ctx, db.Pool, reqs)
			if err != nil {
				b.Fatal(err)
			}
			for _, o := range out {
				if o.Err != nil {
					b.Fatal(o.Err)
				}
			}
		}
	}
	// NUDGE_BENCH_WARMUP=W: W reminders per worker go through the whole
	// pipeline (dispatcher, workers, provider) before the N measured ones
	// are scheduled and the clock starts, so the measured window holds no
	// connection's start: its backend, catalog caches, statement preparation
	// and first plans (about 70 ms of PostgreSQL CPU per connection).
	warm := envInt("NUDGE_BENCH_WARMUP", 0) * k
	if warm == 0 {
		seed(0, n)
	} else {
		seed(n, n+warm)
	}
	// NUDGE_BENCH_WINDOW=open: every SMS under a send window policy that is
	// open now (an hour ago to two hours ahead, UTC), so each claim evaluates it.
	if os.Getenv("NUDGE_BENCH_WINDOW") == "open" {
		h := time.Now().UTC().Hour()
		if _, err := db.Pool.Exec(ctx, `INSERT INTO nudge_send_windows (tenant, channel, window_open, window_close)
			VALUES ('*', 'sms', make_time($1, 0, 0), make_time($2, 0, 0))`, (h+23)%24, (h+2)%24); err != nil {
			b.Fatal(err)
		}
	}
	keys, err := message.ParseKeys("bench:nudge-bench-signing-secret-0123456789")
	if err != nil {
		b.Fatal(err)
	}
	var sender provider.Sender = nopSender{}
	if os.Getenv("NUDGE_BENCH_SENDER") != "nop" {
		sink := httptest.NewServer(fakesms.New())
		b.Cleanup(sink.Close)
		// sms.New's default client, as the sms-worker binary wires it: its
		// timeout is the worker's send timeout. (A shorter one, 10 s as here
		// before, makes the client add a timer of its own to every send,
		// which the binary does not: provider.WithTimeout.)
		timeout := worker.Config{}.WithDefaults().SendTimeout
		if sender, err = sms.New(sms.Config{URL: sink.URL, Timeout: timeout}); err != nil {
			b.Fatal(err)
		}
	}

	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var workers []*worker.Worker
	for i := range k {
		w, err := worker.New(worker.Config{Channel: reminder.SMS, Name: fmt.Sprintf("%s-w%d", topo.Prefix, i)},
			worker.Deps{AMQPURL: mq.URL, Topology: topo, Store: store.New(newPool()), Sender: sender,
				Keys: keys, Clock: clock.Real{}, Log: zerolog.Nop()})
		if err != nil {
			b.Fatal(err)
		}
		workers = append(workers, w)
		wg.Go(func() { _ = w.Run(wctx) })
	}
	defer func() { cancel(); wg.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ready := true
		for _, w := range workers {
			ready = ready && w.Ready()
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("workers not ready")
		}
	}
	pub := broker.NewPublisher(mq.URL, topo, topo.Prefix+"-dispatcher")
	defer pub.Close()
	counted := &countingPublisher{Publisher: pub}
	d := &dispatch.Dispatcher{Enqueuer: dispatch.Enqueuer{
		Store: store.New(newPool()), Publisher: counted, Keys: keys, Topology: topo, Clock: clock.Real{},
		Actor: "bench-dispatcher",
	}, Log: zerolog.Nop(), Config: dispatch.Config{EnvelopeSize: envInt("NUDGE_BENCH_ENVELOPE", 1),
		BurstEnvelopeSize: envInt("NUDGE_BENCH_BURST", 0)}}
	beam := testenv.BrokerPID()
	terminal := func() (done int64) {
		for _, w := range workers {
			c := w.Counts()
			done += c.Delivered + c.Failed + c.Expired
		}
		return done
	}
	if warm > 0 {
		if _, err := d.RunOnce(ctx); err != nil {
			b.Fatalf("dispatcher (warm-up): %v", err)
		}
		for limit := time.Now().Add(5 * time.Minute); terminal() < int64(warm); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(limit) {
				b.Fatalf("warm-up: only %d of %d terminal after 5 minutes", terminal(), warm)
			}
		}
		seed(0, n)
		counted.n.Store(0)
	}
	measured := time.Now() // the measured reminders' events are at or after it
	var frames int64
	for _, w := range workers {
		frames -= w.Counts().AckFrames
	}

	// Backends serving this run: the pools open their connections lazily,
	// and one opened during the run counts from zero.
	backends := func() map[int]time.Duration {
		rows, err := db.Pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
		if err != nil {
			b.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			b.Fatal(err)
		}
		out := map[int]time.Duration{}
		for _, p := range pids {
			out[int(p)] = procCPU(int(p))
		}
		return out
	}
	var wal0, wal1 string
	var dl0, dl1 int64
	walDeadlocks := func(lsn *string, dl *int64) {
		if err := db.Pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text,
			(SELECT deadlocks FROM pg_stat_database WHERE datname = current_database())`).Scan(lsn, dl); err != nil {
			b.Fatal(err)
		}
	}
	tr.reset()
	pg0 := backends()
	walDeadlocks(&wal0, &dl0)
	stopProfile := testenv.CPUProfile(b)
	defer stopProfile()
	cpu0, t0, w0, mq0 := selfCPU(), time.Now(), selfWrites(), procCPU(beam)
	b.ResetTimer()

	dispErr := make(chan error, 1)
	var sum dispatch.Summary
	go func() {
		var err error
		sum, err = d.RunOnce(ctx)
		dispErr <- err
	}()
	var dispElapsed time.Duration
	for limit := time.Now().Add(10 * time.Minute); ; {
		done := terminal() - int64(warm)
		if done >= int64(n) {
			break
		}
		if time.Now().After(limit) {
			b.Fatalf("only %d of %d terminal after 10 minutes", done, n)
		}
		select {
		case err := <-dispErr:
			if err != nil {
				b.Fatalf("dispatcher: %v", err)
			}
			dispElapsed = time.Since(t0)
			dispErr = nil
		case <-time.After(5 * time.Millisecond):
		}
	}
	wall := time.Since(t0)
	b.StopTimer()
	goCPU := selfCPU() - cpu0
	writes := selfWrites() - w0
	mqCPU := procCPU(beam) - mq0
	stopProfile()
	if dispErr != nil {
		if err := <-dispErr; err != nil {
			b.Fatalf("dispatcher: %v", err)
		}
		dispElapsed = time.Since(t0)
	}
	var pgCPU time.Duration
	for pid, c := range backends() {
		pgCPU += c - pg0[pid]
	}
	walDeadlocks(&wal1, &dl1)
	var walBytes float64
	if err := db.Pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)`, wal1, wal0).
		Scan(&walBytes); err != nil {
		b.Fatal(err)
	}
	var first, last time.Time
	var delivered int
	if err := db.Pool.QueryRow(ctx, `SELECT min(at) FILTER (WHERE reason = 'claimed for dispatch'),
		       max(at) FILTER (WHERE to_state IN ('delivered', 'failed', 'expired', 'canceled')),
		       count(*) FILTER (WHERE to_state = 'delivered') FROM reminder_timeline WHERE at >= $1`, measured).
		Scan(&first, &last, &delivered); err != nil {
		b.Fatal(err)
	}
	if delivered != n {
		b.Fatalf("delivered %d of %d", delivered, n)
	}
	rate := float64(n) / last.Sub(first).Seconds()
	per1k := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(n) }

	tr.mu.Lock()
	var names []string
	var calls int64
	for name, s := range tr.m {
		names = append(names, name)
		calls += s.calls
	}
	sort.Slice(names, func(i, j int) bool { return tr.m[names[i]].dur > tr.m[names[j]].dur })
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nN=%d workers=%d rate=%.0f/s wall=%s dispatcher pass=%s (%d batches)\n",
		n, k, rate, wall.Round(time.Millisecond), dispElapsed.Round(time.Millisecond), sum.Batches)
	fmt.Fprintf(&sb, "CPU-s per 1000: go %.3f, pg backends %.3f, RabbitMQ node %.3f (shared); WAL %.0f B/reminder (whole server); deadlocks %d\n",
		per1k(goCPU), per1k(pgCPU), per1k(mqCPU), walBytes/float64(n), dl1-dl0)
	for _, w := range workers {
		frames += w.Counts().AckFrames
	}
	fmt.Fprintf(&sb, "envelope size %d, in a burst %d: %d messages published by the dispatcher, %.3f per reminder; %.3f ack frames per reminder\n",
		d.Config.WithDefaults().EnvelopeSize, d.Config.WithDefaults().BurstEnvelopeSize, counted.n.Load(), float64(counted.n.Load())/float64(n), float64(frames)/float64(n))
	fmt.Fprintf(&sb, "round trips per reminder %.3f, write syscalls per reminder (this process: dispatcher, workers, fake provider) %.2f\n",
		float64(calls)/float64(n), float64(writes)/float64(n))
	fmt.Fprintf(&sb, "%-18s %8s %8s %10s %10s %10s\n", "statement", "calls", "prep", "ms total", "ms/call", "calls/rem")
	for _, name := range names {
		s := tr.m[name]
		fmt.Fprintf(&sb, "%-18s %8d %8d %10.0f %10.2f %10.4f\n", name, s.calls, s.prepares,
			s.dur.Seconds()*1000, s.dur.Seconds()*1000/float64(max(s.calls, 1)), float64(s.calls)/float64(n))
	}
	tr.mu.Unlock()
	b.Log(sb.String())
	b.ReportMetric(rate, "reminders/s")
	b.ReportMetric(per1k(goCPU), "go-cpu-s/1k")
	b.ReportMetric(per1k(pgCPU), "pg-cpu-s/1k")
	b.ReportMetric(float64(calls)/float64(n), "roundtrips/rem")
	b.ReportMetric(walBytes/float64(n), "wal-B/rem")
	b.ReportMetric(float64(writes)/float64(n), "writes/rem")
	b.ReportMetric(per1k(mqCPU), "mq-cpu-s/1k")
	b.ReportMetric(float64(counted.n.Load())/float64(n), "msgs/rem")
	b.ReportMetric(float64(frames)/float64(n), "ack-frames/rem")
}

// countingPublisher counts the messages the dispatcher publishes.
type countingPublisher struct {
	dispatch.Publisher
	n atomic.Int64
}

func (p *countingPublisher) PublishBatch(ctx context.Context, msgs []broker.Outgoing) ([]error, error) {
	p.n.Add(int64(len(msgs)))
	return p.Publisher.PublishBatch(ctx, msgs)
}
