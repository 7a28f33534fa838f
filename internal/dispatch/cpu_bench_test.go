package dispatch_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// onCPU is the time process pid has spent on a CPU (/proc/PID/schedstat,
// nanoseconds); -1 when unreadable (a server on another host).
func onCPU(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.Fields(string(b) + " x")[0], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRunOnceCPU measures what one dispatcher pass (RunOnce, batch 500,
// or NUDGE_BENCH_BATCH: the rows one claim takes, as a shorter --every does)
// over NUDGE_BENCH_N (default 10,000) due SMS reminders costs in CPU per
// 1,000 reminders: this process (claim, sign, publish, record) and the
// PostgreSQL backends of its pool (from /proc/PID/schedstat), which, unlike
// its wall-clock rate, hardly move with the machine's other load, and the
// messages it left in the queue. NUDGE_BENCH_ENVELOPE sets
// Config.EnvelopeSize (default 1), NUDGE_BENCH_BURST Config.BurstEnvelopeSize
// (default: the product's, 200, or 1 at envelope 1; every full claim is a
// burst); the RabbitMQ node's CPU is reported when
// its beam.smp runs on this host (shared with whatever else uses it).
// NUDGE_BENCH_CPUPROFILE=FILE writes a CPU profile of the pass alone.
//
//	go test ./internal/dispatch -run '^$' -bench RunOnceCPU -benchtime 1x -v
func BenchmarkRunOnceCPU(b *testing.B) {
	n := 10000
	if v := os.Getenv("NUDGE_BENCH_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("NUDGE_BENCH_N=%q: want a positive number of reminders", v)
		}
	}
	keys, err := message.ParseKeys("k1:0123456789abcdef0123")
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		runOnceCPU(b, bundle{db: testenv.Postgres(b), mq: testenv.RabbitMQ(b), keys: keys, now: time.Now()}, n)
	}
}

func runOnceCPU(b *testing.B, bu bundle, n int) {
	ctx := context.Background()
	for off := 0; off < n; off += 2000 {
		bu.scheduleFrom(b, off, min(2000, n-off))
	}
	pool, pg := trackedPool(b, bu)
	defer pool.Close()
	pub := broker.NewPublisher(bu.mq.URL, bu.mq.Topology, "bench-dispatcher")
	defer pub.Close()
	d := &dispatch.Dispatcher{Enqueuer: dispatch.Enqueuer{
		Store: store.New(pool), Publisher: pub, Keys: bu.keys, Topology: bu.mq.Topology, Clock: clock.Real{},
		Actor: "bench-dispatcher",
	}, Log: zerolog.Nop(), Config: dispatch.Config{EnvelopeSize: envInt("NUDGE_BENCH_ENVELOPE", 1),
		BurstEnvelopeSize: envInt("NUDGE_BENCH_BURST", 0), Batch: envInt("NUDGE_BENCH_BATCH", 500)}}
	beam := testenv.BrokerPID()
	stopProfile := testenv.CPUProfile(b) // the pass alone, seeding excluded
	defer stopProfile()
	pg0, self0, mq0, wall0 := pg(), selfCPU(), testenv.ProcCPU(beam), time.Now()
	sum, err := d.RunOnce(ctx)
	pg1, self1, mq1, wall := pg(), selfCPU(), testenv.ProcCPU(beam), time.Since(wall0)
	stopProfile()
	if err != nil {
		b.Fatal(err)
	}
	msgs := queued(b, bu.mq.URL, bu.mq.Topology.Queue("sms"))
	if sum.Enqueued != n {
		b.Fatalf("enqueued %d of %d: %+v", sum.Enqueued, n, sum)
	}
	k := float64(n) / 1000
	b.Logf("%d reminders in %d batches, %d messages (envelope size %d, in a burst %d), %s: CPU-ms per 1,000: dispatcher process %.1f, its PostgreSQL backends %.1f (%d), RabbitMQ node %.1f; %.0f reminders/s",
		n, sum.Batches, msgs, d.Config.WithDefaults().EnvelopeSize, d.Config.WithDefaults().BurstEnvelopeSize, wall.Round(time.Millisecond), float64(self1-self0)/1e6/k, float64(pg1-pg0)/1e6/k, 4,
		float64(mq1-mq0)/float64(time.Millisecond)/k, float64(n)/wall.Seconds())
}

// trackedPool is a pool of its own on bu's database, four connections
// opened (what a pass uses: a claim beside the previous batch's record),
// whose PostgreSQL backends are known by pid: pg is the time they have
// spent on a CPU (ns).
func trackedPool(b *testing.B, bu bundle, tracer ...pgx.QueryTracer) (pool *pgxpool.Pool, pg func() int64) {
	ctx := context.Background()
	cfg := bu.db.Pool.Config()
	if len(tracer) > 0 {
		cfg.ConnConfig.Tracer = tracer[0]
	}
	var mu sync.Mutex
	var pids []int
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		if ms := os.Getenv("NUDGE_BENCH_AUTOEXPLAIN_MS"); ms != "" { // statements slower than ms, with their plans, in the server log
			if _, err := c.Exec(ctx, "LOAD 'auto_explain'; SET auto_explain.log_min_duration = "+strconv.Quote(ms)+
				"; SET auto_explain.log_analyze = on; SET auto_explain.log_buffers = on; SET auto_explain.log_timing = off"); err != nil {
				return err
			}
		}
		mu.Lock()
		defer mu.Unlock()
		pids = append(pids, int(c.PgConn().PID()))
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	var conns []*pgxpool.Conn
	for range 4 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	return pool, func() (sum int64) {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range pids {
			sum += onCPU(p)
		}
		return sum
	}
}

// BenchmarkLoopCadenceCPU measures what Loop's passes cost at a steady
// stream, by the gap between their starts (issue 18: a pass as soon as rows
// are due, at least MinGap apart): NUDGE_BENCH_RATE reminders a second
// (default 4,300, half load) due one after the other over
// NUDGE_BENCH_SECONDS (default 2), worked by passes NUDGE_BENCH_GAPS apart
// (default 100ms,20ms,10ms: the fixed tick, and minimum gaps), each pass
// RunOnce then NextDue as Loop runs them, on a fake clock moved by the gap
// (no worker: the dispatcher's side alone). The gaps alternate,
// NUDGE_BENCH_ROUNDS rounds (default 3), each on a stream of its own; it
// reports CPU-ms per 1,000 reminders and per pass of this process and of
// the pool's PostgreSQL backends (/proc/PID/schedstat: CPU, not wall, so
// the machine's other load moves it little). With NUDGE_BENCH_RATE=0 the
// passes find nothing due: the cost of an idle pass.
// NUDGE_BENCH_PROMOTE_EVERY sets Config.PromoteEvery (-1ns: a promoter pass
// before every claim, as before --promote-every). NUDGE_BENCH_STATEMENTS=1
// adds, per gap, the statements of an idle and of a claiming pass (NextDue
// included), each with its count a pass and its mean time as the client saw
// it (a pgx tracer: pg_stat_statements is not loaded on the test server; the
// tracer's own cost lands in the dispatcher's CPU, so leave it off when
// measuring CPU).
//
//	go test ./internal/dispatch -run '^$' -bench LoopCadenceCPU -benchtime 1x -v
func BenchmarkLoopCadenceCPU(b *testing.B) {
	rate, secs, rounds := envInt("NUDGE_BENCH_RATE", 4300), envInt("NUDGE_BENCH_SECONDS", 2), envInt("NUDGE_BENCH_ROUNDS", 3)
	if os.Getenv("NUDGE_BENCH_RATE") == "0" {
		rate = 0
	}
	var gaps []time.Duration
	for _, g := range strings.Split(cmp.Or(os.Getenv("NUDGE_BENCH_GAPS"), "100ms,20ms,10ms"), ",") {
		d, err := time.ParseDuration(g)
		if err != nil || d <= 0 {
			b.Fatalf("NUDGE_BENCH_GAPS: %q", g)
		}
		gaps = append(gaps, d)
	}
	keys, err := message.ParseKeys("k1:0123456789abcdef0123")
	if err != nil {
		b.Fatal(err)
	}
	var promoteEvery time.Duration
	if v := os.Getenv("NUDGE_BENCH_PROMOTE_EVERY"); v != "" {
		if promoteEvery, err = time.ParseDuration(v); err != nil {
			b.Fatalf("NUDGE_BENCH_PROMOTE_EVERY: %v", err)
		}
	}
	var stmts *statementLog
	var tracers []pgx.QueryTracer
	if os.Getenv("NUDGE_BENCH_STATEMENTS") == "1" {
		stmts = &statementLog{}
		tracers = append(tracers, stmts)
	}
	for range b.N {
		bu := bundle{db: testenv.Postgres(b), mq: testenv.RabbitMQ(b), keys: keys, now: time.Now()}
		pool, pg := trackedPool(b, bu, tracers...)
		pub := broker.NewPublisher(bu.mq.URL, bu.mq.Topology, "bench-dispatcher")
		ctx := context.Background()
		n := rate * secs
		for r := range rounds {
			for gi, gap := range gaps {
				// A stream of its own after the others (all within lazy
				// intake's horizon: each gets its state row at intake).
				start := bu.now.Add(time.Minute + time.Duration(r*len(gaps)+gi)*time.Duration(secs+1)*time.Second)
				if n > 0 {
					bu.scheduleStream(b, fmt.Sprintf("r%dg%d", r, gi), start, n, time.Second/time.Duration(rate))
				}
				if _, err := bu.db.Pool.Exec(ctx, `VACUUM ANALYZE reminder_state`); err != nil {
					b.Fatal(err)
				}
				f := clock.NewFake(start)
				d := &dispatch.Dispatcher{Enqueuer: dispatch.Enqueuer{Store: store.New(pool), Publisher: pub, Keys: bu.keys,
					Topology: bu.mq.Topology, Clock: f, Actor: "bench-dispatcher"}, Log: zerolog.Nop(),
					Config: dispatch.Config{PromoteEvery: promoteEvery}}
				passes, claimed := 0, 0
				idle, claiming := statementSplit{}, statementSplit{}
				stmts.take()
				var perPassPG []float64 // ms
				pg0, self0, wall0 := pg(), selfCPU(), time.Now()
				for at := start; !at.After(start.Add(time.Duration(secs) * time.Second)); at = at.Add(gap) {
					f.Set(at)
					pgBefore := pg()
					sum, err := d.RunOnce(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := dispatch.NextDue(ctx, pool, sum.Cutoff); err != nil {
						b.Fatal(err)
					}
					passes++
					claimed += sum.Claimed
					if sum.Claimed == 0 {
						idle.add(stmts.take())
					} else {
						claiming.add(stmts.take())
					}
					perPassPG = append(perPassPG, float64(pg()-pgBefore)/1e6)
				}
				pg1, self1, wall := pg(), selfCPU(), time.Since(wall0)
				if claimed != n {
					b.Fatalf("claimed %d of %d", claimed, n)
				}
				perK, perPass := 1000/float64(max(n, 1)), 1/float64(passes)
				q := len(perPassPG) / 4
				b.Logf("round %d, a pass every %s: %d passes, %d reminders (%.0f a pass), %s: CPU-ms per 1,000: dispatcher %.1f, its PostgreSQL backends %.1f; per pass: %.3f, %.3f (PostgreSQL's median in the first quarter of the passes %.3f, the last %.3f)",
					r+1, gap, passes, n, float64(n)*perPass, wall.Round(time.Millisecond),
					float64(self1-self0)/1e6*perK, float64(pg1-pg0)/1e6*perK, float64(self1-self0)/1e6*perPass, float64(pg1-pg0)/1e6*perPass,
					median(perPassPG[:q]), median(perPassPG[len(perPassPG)-q:]))
				if stmts != nil {
					b.Logf("round %d, a pass every %s: statements of an idle pass: %s", r+1, gap, idle)
					b.Logf("round %d, a pass every %s: statements of a claiming pass: %s", r+1, gap, claiming)
				}
			}
		}
		pub.Close()
		pool.Close()
	}
}

// BenchmarkLoopIdleCPU runs Loop (every NUDGE_BENCH_EVERY, default 100ms,
// the product's MinGap) on the wall clock for NUDGE_BENCH_SECONDS (default
// 5) with nothing due but one reminder tomorrow, and reports its passes and
// CPU-ms per second of this process and of its pool's PostgreSQL backends:
// an idle loop passes every --every, not every MinGap.
//
//	go test ./internal/dispatch -run '^$' -bench LoopIdleCPU -benchtime 1x -v
func BenchmarkLoopIdleCPU(b *testing.B) {
	every, err := time.ParseDuration(cmp.Or(os.Getenv("NUDGE_BENCH_EVERY"), "100ms"))
	if err != nil {
		b.Fatal(err)
	}
	secs := envInt("NUDGE_BENCH_SECONDS", 5)
	keys, err := message.ParseKeys("k1:0123456789abcdef0123")
	if err != nil {
		b.Fatal(err)
	}
	for range b.N {
		bu := bundle{db: testenv.Postgres(b), mq: testenv.RabbitMQ(b), keys: keys, now: time.Now()}
		bu.scheduleSMS(b, "tomorrow", 0, 1, func(int) time.Time { return bu.now.Add(24 * time.Hour) }, time.Hour)
		pool, pg := trackedPool(b, bu)
		pub := broker.NewPublisher(bu.mq.URL, bu.mq.Topology, "bench-dispatcher")
		passes := 0
		d := &dispatch.Dispatcher{Enqueuer: dispatch.Enqueuer{Store: store.New(pool), Publisher: pub, Keys: bu.keys,
			Topology: bu.mq.Topology, Clock: clock.Real{}, Actor: "bench-dispatcher"}, Log: zerolog.Nop(),
			AfterRun: func(_ context.Context, sum dispatch.Summary, _ error) { passes += sum.Passes }}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second)
		pg0, self0, wall0 := pg(), selfCPU(), time.Now()
		if err := d.Loop(ctx, every); err != nil {
			b.Fatal(err)
		}
		pg1, self1, wall := pg(), selfCPU(), time.Since(wall0)
		cancel()
		b.Logf("idle loop, --every %s, min gap %s: %d passes in %s (%.1f a second): CPU-ms a second: dispatcher %.2f, its PostgreSQL backends %.2f",
			every, d.Config.WithDefaults().MinGap, passes, wall.Round(time.Millisecond), float64(passes)/wall.Seconds(),
			float64(self1-self0)/1e6/wall.Seconds(), float64(pg1-pg0)/1e6/wall.Seconds())
		pub.Close()
		pool.Close()
	}
}

// median is xs' median (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Sorted(slices.Values(xs))
	return xs[len(xs)/2]
}

// scheduleStream schedules n due SMS reminders keyed prefix-i, one every
// step from start, in four tenants.
func (b bundle) scheduleStream(tb testing.TB, prefix string, start time.Time, n int, step time.Duration) {
	tb.Helper()
	for off := 0; off < n; off += 2000 {
		b.scheduleSMS(tb, prefix, off, min(off+2000, n), func(i int) time.Time { return start.Add(time.Duration(i) * step) }, time.Hour)
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// queued is how many messages queue holds.
func queued(tb testing.TB, url, queue string) int {
	conn, err := broker.Dial(url, "bench-reader")
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		tb.Fatal(err)
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return q.Messages
}

// scheduleFrom schedules count due SMS reminders numbered from off, in four
// tenants.
func (b bundle) scheduleFrom(tb testing.TB, off, count int) {
	tb.Helper()
	b.scheduleSMS(tb, "cpu", off, off+count, func(int) time.Time { return b.now.Add(-time.Minute) }, 61*time.Minute)
}

// scheduleSMS schedules the SMS reminders from to to-1, keyed prefix-i, in
// four tenants, each due at due(i) with its deadline life later.
func (b bundle) scheduleSMS(tb testing.TB, prefix string, from, to int, due func(int) time.Time, life time.Duration) {
	tb.Helper()
	reqs := make([]intake.Request, 0, to-from)
	for i := from; i < to; i++ {
		reqs = append(reqs, intake.Request{Tenant: fmt.Sprintf("tenant-%d", i%4), Key: fmt.Sprintf("%s-%d", prefix, i),
			Channel: reminder.SMS, Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
			DueAt: due(i), Deadline: due(i).Add(life)})
	}
	out, err := intake.ScheduleMany(context.Background(), b.db.Pool, reqs)
	if err != nil {
		tb.Fatal(err)
	}
	for _, o := range out {
		if o.Err != nil {
			tb.Fatal(o.Err)
		}
	}
}

// statementLog is a pgx tracer that counts the statements run through a
// pool and the time each took as the client saw it (start to end), by
// statement (statementLabel); take returns what it holds and empties it.
// Nil: it records nothing.
type statementLog struct {
	mu   sync.Mutex
	seen map[string]statementCost
}

type statementCost struct {
	N   int
	Dur time.Duration
}

type statementStart struct{}

type statementBegun struct {
	label string
	at    time.Time
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, statementStart{}, statementBegun{label: statementLabel(data.SQL), at: time.Now()})
}

func (l *statementLog) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	st, ok := ctx.Value(statementStart{}).(statementBegun)
	if !ok {
		return
	}
	d := time.Since(st.at)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]statementCost{}
	}
	c := l.seen[st.label]
	c.N++
	c.Dur += d
	l.seen[st.label] = c
}

func (l *statementLog) take() map[string]statementCost {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.seen
	l.seen = nil
	return m
}

// statementLabel names a statement by its first SQL words (comments
// skipped).
func statementLabel(sql string) string {
	var words []string
	for _, line := range strings.Split(sql, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "--") {
			continue
		}
		words = append(words, strings.Fields(line)...)
		if len(words) >= 6 {
			break
		}
	}
	return strings.Join(words[:min(len(words), 6)], " ")
}

// statementSplit sums the statements of a kind of pass.
type statementSplit struct {
	passes int
	by     map[string]statementCost
}

func (s *statementSplit) add(m map[string]statementCost) {
	s.passes++
	if s.by == nil {
		s.by = map[string]statementCost{}
	}
	for k, c := range m {
		t := s.by[k]
		t.N += c.N
		t.Dur += c.Dur
		s.by[k] = t
	}
}

// String lists the statements a pass ran on average, most frequent first:
// per pass, and each one's mean time.
func (s statementSplit) String() string {
	if s.passes == 0 {
		return "no such pass"
	}
	labels := slices.Collect(maps.Keys(s.by))
	slices.SortFunc(labels, func(a, b string) int { return cmp.Or(cmp.Compare(s.by[b].N, s.by[a].N), cmp.Compare(a, b)) })
	total, dur := 0, time.Duration(0)
	var sb strings.Builder
	for _, k := range labels {
		c := s.by[k]
		total += c.N
		dur += c.Dur
		fmt.Fprintf(&sb, "; %.2f a pass of %q, %.3f ms each", float64(c.N)/float64(s.passes), k, float64(c.Dur)/float64(c.N)/1e6)
	}
	return fmt.Sprintf("%d passes, %.2f statements a pass, %.3f ms a pass as the client saw them%s", s.passes,
		float64(total)/float64(s.passes), float64(dur)/float64(s.passes)/1e6, sb.String())
}
