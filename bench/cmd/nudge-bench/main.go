// Command nudge-bench measures Nudge end to end, side by side with River and
// the raw broker, on the PostgreSQL and RabbitMQ of this machine, and writes
// docs/benchmarks.md with a chart. Every benchmark runs in a PostgreSQL
// schema and a queue prefix of its own, deleted afterwards.
package main

import (
	"context"
	"flag"
	"fmt"
	"image/color"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/testenv"
)

type options struct {
	n, runs, window  int
	workers          []int
	out, chart, prof string
	profileWorkers   int
	diagnose         bool
}

func main() {
	var o options
	var workers string
	flag.IntVar(&o.n, "n", 20000, "reminders / jobs / messages per run (the issue's full size is 100000)")
	flag.IntVar(&o.runs, "runs", 3, "repetitions of every measurement (median, min, max are reported)")
	flag.StringVar(&workers, "workers", "1,2,4", "worker counts for the end-to-end and River runs")
	flag.IntVar(&o.window, "window", 1000, "raw broker confirm window and consumer prefetch")
	flag.StringVar(&o.out, "out", "../docs/benchmarks.md", "report to write")
	flag.StringVar(&o.chart, "chart", "../docs/benchmarks-throughput.png", "chart to write")
	flag.StringVar(&o.prof, "cpuprofile", "out/cpu-e2e.pprof", "CPU profile of the first end-to-end run with -profile-workers workers (empty: none)")
	flag.IntVar(&o.profileWorkers, "profile-workers", 2, "worker count of the profiled end-to-end run")
	flag.BoolVar(&o.diagnose, "diagnose", false, "instead of the benchmark: EXPLAIN ANALYZE the dispatcher's statements and sample pg_stat_activity during one e2e run with -profile-workers workers")
	flag.Parse()
	for _, w := range strings.Split(workers, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || k < 1 {
			fmt.Fprintln(os.Stderr, "bad -workers:", workers)
			os.Exit(2)
		}
		o.workers = append(o.workers, k)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "nudge-bench:", err)
		os.Exit(1)
	}
}

type results struct {
	raw      []rawResult
	disp     []dispatchResult
	e2e      map[int][]e2eResult
	river    map[int][]riverResult
	elapsed  time.Duration
	profiled string
	loads    []float64
}

func run(ctx context.Context, o options) error {
	e := &env{dbURL: os.Getenv("NUDGE_TEST_DATABASE_URL"), amqpURL: os.Getenv("NUDGE_TEST_AMQP_URL")}
	if e.dbURL == "" {
		e.dbURL = testenv.DefaultDatabaseURL
	}
	if e.amqpURL == "" {
		e.amqpURL = testenv.DefaultAMQPURL
	}
	var err error
	if e.admin, err = pgxpool.New(ctx, e.dbURL); err != nil {
		return err
	}
	defer e.admin.Close()
	if err := e.admin.Ping(ctx); err != nil {
		return fmt.Errorf("PostgreSQL at %s: %w", e.dbURL, err)
	}
	if o.diagnose {
		return diagnose(ctx, e, o.n, o.profileWorkers)
	}
	m := describe(ctx, e)
	fmt.Printf("nudge-bench: n=%d runs=%d workers=%v on %d CPUs, PostgreSQL %s, RabbitMQ %s, %s\n",
		o.n, o.runs, o.workers, m.CPUs, m.Postgres, m.RabbitMQ, m.Go)
	r := results{e2e: map[int][]e2eResult{}, river: map[int][]riverResult{}}
	start := time.Now()
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		for lctx.Err() == nil {
			r.loads = append(r.loads, loadAvg())
			select {
			case <-lctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}()
	if o.prof != "" {
		if err := os.MkdirAll(filepath.Dir(o.prof), 0o755); err != nil {
			return err
		}
	}
	// Interleave the measurements so a slow minute of the machine spreads
	// over all of them rather than skewing one.
	for i := range o.runs {
		fmt.Printf("run %d/%d\n", i+1, o.runs)
		rr, err := rawBroker(ctx, e, o.n, o.window)
		if err != nil {
			return fmt.Errorf("raw broker: %w", err)
		}
		fmt.Printf("  raw broker: publish %.0f msg/s, consume %.0f msg/s\n", rr.PublishRate, rr.ConsumeRate)
		r.raw = append(r.raw, rr)
		dr, err := dispatcherAlone(ctx, e, o.n)
		if err != nil {
			return fmt.Errorf("dispatcher alone: %w", err)
		}
		fmt.Printf("  dispatcher alone: %.0f reminders/s (%d batches)\n", dr.Rate, dr.Batches)
		r.disp = append(r.disp, dr)
		for _, k := range o.workers {
			prof := ""
			if i == 0 && k == o.profileWorkers {
				prof, r.profiled = o.prof, o.prof
			}
			er, err := nudgeE2E(ctx, e, o.n, k, prof)
			if err != nil {
				return fmt.Errorf("nudge e2e, %d workers: %w", k, err)
			}
			fmt.Printf("  nudge e2e, %d workers: %.0f reminders/s (%s, %d delivered, p99 claim-to-terminal %.0f ms)\n",
				k, er.Rate, er.Elapsed.Round(time.Millisecond), er.Delivered, er.P99)
			r.e2e[k] = append(r.e2e[k], er)
			vr, err := riverRun(ctx, e, o.n, k)
			if err != nil {
				return fmt.Errorf("river, %d workers: %w", k, err)
			}
			fmt.Printf("  river, %d clients: %.0f jobs/s (%s)\n", k, vr.Rate, vr.Elapsed.Round(time.Millisecond))
			r.river[k] = append(r.river[k], vr)
		}
	}
	r.elapsed = time.Since(start)
	stopLoad()
	<-loadDone
	return report(o, m, r)
}

func pick[T any](xs []T, f func(T) float64) stats {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	return summarize(v)
}

func fmtS(s stats) string { return fmt.Sprintf("%.0f | %.0f | %.0f", s.Median, s.Min, s.Max) }

func report(o options, m machine, r results) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	groups := make([]string, len(o.workers))
	var nudgeS, riverS []stats
	for i, k := range o.workers {
		groups[i] = fmt.Sprintf("%d worker(s)", k)
		nudgeS = append(nudgeS, pick(r.e2e[k], func(x e2eResult) float64 { return x.Rate }))
		riverS = append(riverS, pick(r.river[k], func(x riverResult) float64 { return x.Rate }))
	}
	if o.chart != "" {
		if err := drawChart(o.chart, fmt.Sprintf("Throughput vs workers, N=%d (Nudge reminders/s end to end; River no-op jobs/s)", o.n),
			groups, []series{
				{Name: "Nudge end to end", Color: color.RGBA{52, 101, 164, 255}, Vals: nudgeS},
				{Name: "River (no-op jobs)", Color: color.RGBA{245, 121, 0, 255}, Vals: riverS},
			}); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
	}
	rawPub := pick(r.raw, func(x rawResult) float64 { return x.PublishRate })
	rawCon := pick(r.raw, func(x rawResult) float64 { return x.ConsumeRate })
	disp := pick(r.disp, func(x dispatchResult) float64 { return x.Rate })

	p("# Benchmarks\n\n")
	p("Written by `make bench` (`bench/cmd/nudge-bench`, a module of its own so River never enters the main module) on %s, in %s.\n",
		m.When.Format("2006-01-02 15:04 UTC"), r.elapsed.Round(time.Second))
	p("N = %d per run; every figure is the **median of %d runs** with min and max; the measurements are interleaved run by run.\n\n", o.n, o.runs)
	p("## Machine\n\n| | |\n|---|---|\n")
	p("| CPUs (nproc) | %d × %s |\n| memory | %.1f GiB |\n| kernel | %s |\n| Go | %s |\n| PostgreSQL | %s (same machine) |\n| RabbitMQ | %s (same machine) |\n\n",
		m.CPUs, m.CPUModel, m.MemGiB, m.Kernel, m.Go, m.Postgres, m.RabbitMQ)

	ls := summarize(r.loads)
	p("Load average (1 min) sampled every 5 s during the run: median %.1f, min %.1f, max %.1f on %d CPUs. ", ls.Median, ls.Min, ls.Max, m.CPUs)
	p("The CPU tables count the seconds other processes on the machine used during each measurement (\"other\"): anything well above zero means the figures were taken on a shared machine and are noisier than the ratios.\n\n")
	p("## Targets (ratios measured in the same run)\n\n| target | measured (median) | met |\n|---|---|---|\n")
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	yes := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	for i, k := range o.workers {
		rt := ratio(nudgeS[i].Median, riverS[i].Median)
		target := ""
		if k == 2 {
			target = " (the target)"
		}
		p("| Nudge e2e / River, %d worker(s)%s ≥ 1.0 | %.2f (%.0f / %.0f) | %s |\n", k, target, rt, nudgeS[i].Median, riverS[i].Median, yes(rt >= 1.0))
	}
	dr := ratio(disp.Median, rawPub.Median)
	p("| dispatcher claim-publish-record / raw publish ≥ 0.60 | %.2f (%.0f / %.0f) | %s |\n", dr, disp.Median, rawPub.Median, yes(dr >= 0.6))
	p("| claim rate at 10M rows within 20%% of 10k | not measured yet (TODO) | – |\n")
	p("| p99 enqueue-to-terminal < 50 ms at 50%% load | not measured yet (TODO; saturated claim-to-terminal below) | – |\n")
	p("| worker peak RSS < 64 MiB | not measured per process yet (TODO; harness RSS below) | – |\n\n")

	p("![Throughput vs worker count, Nudge vs River](benchmarks-throughput.png)\n\n")

	p("## 1. End to end: Nudge vs River\n\n")
	p("Nudge: N SMS reminders already due, one dispatcher pass (`Dispatcher.RunOnce`, batch 500) and k **in-process** `worker.Worker` instances (default config: concurrency 4, batch 50, prefetch 400), each with its own PostgreSQL pool and AMQP connections, sending to the fake SMS provider (`fakesms.New()` on `httptest`, answering at once, over a pooled HTTP transport). Rate = N / (first `leased` event → last terminal event), both from `reminder_events`. Every reminder delivered in every run: %s.\n\n", yes(allDelivered(r, o.n)))
	p("River %s: the same N no-op jobs inserted with `InsertMany` (before the clock starts) and worked by k `river.Client`s, each with its own pool and `MaxWorkers` %d (the in-flight capacity of one Nudge worker: 4 × 50), default fetch settings. Rate = N / (first `attempted_at` → last `finalized_at`).\n\n", riverVersion, riverPerWorker)
	p("| workers | Nudge reminders/s median | min | max | River jobs/s median | min | max | Nudge / River |\n|---|---|---|---|---|---|---|---|\n")
	for i, k := range o.workers {
		p("| %d | %s | %s | %.2f |\n", k, fmtS(nudgeS[i]), fmtS(riverS[i]), ratio(nudgeS[i].Median, riverS[i].Median))
	}
	p("\n### CPU seconds per 1,000 (median), from /proc\n\n")
	p("Sampled from `/proc/*/stat` before and after each run: `postgres` processes, RabbitMQ (`beam.smp` and helpers), and the harness process (which hosts the Nudge dispatcher and workers — or the River clients — plus the fake SMS provider). Backends that exit during a run are not counted.\n\n")
	p("| system | workers | PostgreSQL | RabbitMQ | Nudge/River process | total | other processes (noise) |\n|---|---|---|---|---|---|---|\n")
	per := func(c cpuTicks, n int) (a, bq, h float64) {
		f := 1000 / float64(n)
		return c.Postgres * f, c.RabbitMQ * f, c.Harness * f
	}
	other := func(xs []float64) float64 { return summarize(xs).Median }
	for _, k := range o.workers {
		var pg, mq, h, ot []float64
		for _, x := range r.e2e[k] {
			a, bq, c := per(x.CPU, o.n)
			pg, mq, h, ot = append(pg, a), append(mq, bq), append(h, c), append(ot, x.CPU.Other*1000/float64(o.n))
		}
		p("| Nudge | %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n", k, summarize(pg).Median, summarize(mq).Median, summarize(h).Median,
			summarize(pg).Median+summarize(mq).Median+summarize(h).Median, other(ot))
		pg, mq, h, ot = nil, nil, nil, nil
		for _, x := range r.river[k] {
			a, bq, c := per(x.CPU, o.n)
			pg, mq, h, ot = append(pg, a), append(mq, bq), append(h, c), append(ot, x.CPU.Other*1000/float64(o.n))
		}
		p("| River | %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n", k, summarize(pg).Median, summarize(mq).Median, summarize(h).Median,
			summarize(pg).Median+summarize(mq).Median+summarize(h).Median, other(ot))
	}
	p("\n### Claim-to-terminal latency under saturation (not the 50%%-load target)\n\n")
	p("Per reminder, first `leased` event → terminal event, with the whole backlog due at once, so this is mostly queueing time; it is **not** the issue's latency-at-50%%-load figure.\n\n")
	p("| workers | p50 ms | p99 ms | max ms |\n|---|---|---|---|\n")
	for _, k := range o.workers {
		p("| %d | %.0f | %.0f | %.0f |\n", k,
			pick(r.e2e[k], func(x e2eResult) float64 { return x.P50 }).Median,
			pick(r.e2e[k], func(x e2eResult) float64 { return x.P99 }).Median,
			pick(r.e2e[k], func(x e2eResult) float64 { return x.Max }).Median)
	}

	p("\n## 2. Dispatcher alone vs raw broker\n\n")
	p("Dispatcher alone: one `RunOnce` (batch 500) over N due reminders with no consumer: claim (one statement per batch) + sign + publish with confirms and `mandatory` + record `enqueued`; rate = enqueued / run time.\n")
	p("Raw broker: N persistent 100-byte messages to a quorum queue of its own, publisher confirms in windows of %d; then consumed with manual acks (one `basic.ack` per message, prefetch %d).\n\n", o.window, o.window)
	p("| measurement | median | min | max |\n|---|---|---|---|\n")
	p("| raw publish with confirms, msg/s | %s |\n", strings.ReplaceAll(fmtS(rawPub), "|", "|"))
	p("| raw consume with manual ack, msg/s | %s |\n", fmtS(rawCon))
	p("| dispatcher claim-publish-record, reminders/s | %s |\n", fmtS(disp))
	p("| dispatcher / raw publish | %.2f | | |\n\n", dr)

	p("## 3. Memory (rough proxy)\n\n")
	p("Peak RSS (`VmHWM`, reset through `/proc/self/clear_refs` before each run) of the **harness process**, which hosts everything in-process; not yet the per-process worker and dispatcher figures the issue asks for.\n\n")
	p("| run | peak RSS MiB median | min | max |\n|---|---|---|---|\n")
	p("| dispatcher alone | %s |\n", fmtSf(pick(r.disp, func(x dispatchResult) float64 { return x.RSS })))
	for _, k := range o.workers {
		p("| Nudge e2e, %d in-process workers + dispatcher + fake SMS | %s |\n", k, fmtSf(pick(r.e2e[k], func(x e2eResult) float64 { return x.RSS })))
		p("| River, %d clients | %s |\n", k, fmtSf(pick(r.river[k], func(x riverResult) float64 { return x.RSS })))
	}
	if r.profiled != "" {
		p("\n## Profile\n\nA CPU profile of the first end-to-end run with %d workers is written to `bench/%s` (`go tool pprof -top bench/%s`).\n", o.profileWorkers, r.profiled, r.profiled)
	}
	p("\n## Not measured yet (TODO, issue 4)\n\n")
	p("- Workers as separate processes (this run hosts them in the harness process); CPU and RSS per process.\n")
	p("- Latency at 50%% of the measured throughput: p50/p99/max per hop (due→claim, claim→enqueue, enqueue→worker start, start→terminal) and end to end, with reminders becoming due at a steady rate and the dispatcher in `--every` loop.\n")
	p("- Claim rate with 10 thousand, 1 million and 10 million rows present.\n")
	p("- Raw broker publishing and consuming at once (the issue's 17,000 msg/s reference).\n")
	p("- N = 100,000 (`make bench BENCH_N=100000`).\n")
	p("\n`cd bench && go run ./cmd/nudge-bench -diagnose` runs EXPLAIN (ANALYZE, BUFFERS, WAL) on the dispatcher's statements over N due reminders and samples `pg_stat_activity` every 5 ms during one end-to-end run: where PostgreSQL spends its time, by statement and wait event.\n")
	// Hand-written notes below the marker survive a regeneration.
	p("\n%s\n", notesMarker)
	if old, err := os.ReadFile(o.out); err == nil {
		if _, tail, ok := strings.Cut(string(old), notesMarker+"\n"); ok {
			b.WriteString(tail)
		}
	}
	return os.WriteFile(o.out, []byte(b.String()), 0o644)
}

func fmtSf(s stats) string { return fmt.Sprintf("%.1f | %.1f | %.1f", s.Median, s.Min, s.Max) }

const riverVersion = "v0.51.2"

// notesMarker starts the hand-written part of the report, kept as is.
const notesMarker = "<!-- Hand-written notes below this line are kept by nudge-bench. -->"

func allDelivered(r results, n int) bool {
	for _, rs := range r.e2e {
		for _, x := range rs {
			if x.Delivered != n {
				return false
			}
		}
	}
	return true
}
