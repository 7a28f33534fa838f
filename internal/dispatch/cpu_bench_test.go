package dispatch_test

import (
	"context"
	"fmt"
	"os"
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
// (default: the product's, 100, or 1 at envelope 1; every full claim is a
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
	// A pool of its own whose backends are known by pid.
	cfg := bu.db.Pool.Config()
	var mu sync.Mutex
	var pids []int
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		mu.Lock()
		defer mu.Unlock()
		pids = append(pids, int(c.PgConn().PID()))
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	var conns []*pgxpool.Conn
	for range 4 { // what the pass uses: a claim beside the previous batch's record
		c, err := pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	pub := broker.NewPublisher(bu.mq.URL, bu.mq.Topology, "bench-dispatcher")
	defer pub.Close()
	d := &dispatch.Dispatcher{Enqueuer: dispatch.Enqueuer{
		Store: store.New(pool), Publisher: pub, Keys: bu.keys, Topology: bu.mq.Topology, Clock: clock.Real{},
		Actor: "bench-dispatcher",
	}, Log: zerolog.Nop(), Config: dispatch.Config{EnvelopeSize: envInt("NUDGE_BENCH_ENVELOPE", 1),
		BurstEnvelopeSize: envInt("NUDGE_BENCH_BURST", 0), Batch: envInt("NUDGE_BENCH_BATCH", 500)}}
	beam := testenv.BrokerPID()

	pg := func() (sum int64) {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range pids {
			sum += onCPU(p)
		}
		return sum
	}
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
		n, sum.Batches, msgs, d.Config.WithDefaults().EnvelopeSize, d.Config.WithDefaults().BurstEnvelopeSize, wall.Round(time.Millisecond), float64(self1-self0)/1e6/k, float64(pg1-pg0)/1e6/k, len(pids),
		float64(mq1-mq0)/float64(time.Millisecond)/k, float64(n)/wall.Seconds())
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
	reqs := make([]intake.Request, 0, count)
	for i := off; i < off+count; i++ {
		reqs = append(reqs, intake.Request{Tenant: fmt.Sprintf("tenant-%d", i%4), Key: fmt.Sprintf("cpu-%d", i),
			Channel: reminder.SMS, Recipient: fmt.Sprintf("+1415%07d", i), Template: "course-expiry",
			DueAt: b.now.Add(-time.Minute), Deadline: b.now.Add(time.Hour)})
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
