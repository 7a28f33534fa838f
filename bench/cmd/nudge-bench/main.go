// Command nudge-bench measures Nudge on the PostgreSQL and RabbitMQ of this
// machine and writes docs/benchmarks.md with a chart, so that every figure
// the performance issue asks for comes from one command (`make bench`) and
// one run, side by side with River and the raw broker as references:
//
//   - end-to-end throughput against River at 1, 2 and 4 workers (River both
//     with its default fetch settings and tuned as its own `river bench`
//     tunes it), with the CPU each side spends (in-process workers, so the
//     profile sees them);
//   - the dispatcher alone against raw publishing with confirms, and the raw
//     broker publishing, consuming, and doing both at once;
//   - latency per hop at half the measured throughput, from the event trail
//     and the hop histograms;
//   - the claim rate with 10 thousand, 1 million and 10 million rows present;
//   - the peak RSS of the real worker and dispatcher binaries, each a process
//     of its own;
//   - the planning rate of a campaign (intents per second of one planner,
//     its slice time) beside `nudgectl schedule -f` and the SQL function
//     nudge_schedule on the same N (planning.go).
//
// Every benchmark runs in a PostgreSQL schema and a queue prefix of its own,
// deleted afterwards, even when the run fails or is interrupted. Every
// figure is the median of several runs with min and max, the runs
// interleaved so a slow minute of a shared machine spreads over all of them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/nudgehq/nudge/internal/testenv"
)

type options struct {
	n, nOther, runs, window int
	nDispatch               int // the raw broker and the dispatcher alone
	workers                 []int
	headline                int
	out, chart, prof, repo  string
	profileWorkers          int
	diagnose                bool
	sections                map[string]bool

	latencyLoad, latencyRate float64
	latencyFor, latencyEvery time.Duration

	scaleSizes          []int
	scrapeSizes         []int
	scalePerRun, batch  int
	controlSize         int
	procN, procPrefetch int
	procProfile         string
	planningN           int
}

// sections of a run, for -only.
var allSections = []string{"raw", "dispatcher", "e2e", "latency", "procs", "burst", "planning", "scale", "scrape"}

func main() {
	var o options
	var workers, sizes, scrapeSizes, only string
	var serveProvider bool
	flag.BoolVar(&serveProvider, "serve-fake-provider", false, "instead of the benchmark: serve the instant fake SMS provider on a loopback port, print its URL, stop when stdin ends (the harness runs itself so, to read the provider's CPU apart)")
	flag.IntVar(&o.n, "n", 100000, "reminders / jobs per run of the headline comparison (-headline workers, Nudge and River)")
	flag.IntVar(&o.nOther, "n-other", 10000, "reminders / jobs per run everywhere else (other worker counts, burst)")
	flag.IntVar(&o.nDispatch, "n-dispatch", 50000, "messages / reminders per run of the raw broker and the dispatcher alone (each lasts about 2 s at 50,000: at 10,000 a run lasted 0.3 s and its ratio moved by a quarter from run to run)")
	flag.IntVar(&o.runs, "runs", 3, "repetitions of every measurement (median, min, max are reported)")
	flag.StringVar(&workers, "workers", "1,2,4", "worker counts for the end-to-end and River runs")
	flag.IntVar(&o.headline, "headline", 2, "the worker count of the headline comparison (runs at -n)")
	flag.IntVar(&o.window, "window", 1000, "raw broker confirm window and consumer prefetch")
	flag.StringVar(&o.out, "out", "../docs/benchmarks.md", "report to write")
	flag.StringVar(&o.chart, "chart", "../docs/benchmarks-throughput.png", "chart to write")
	flag.StringVar(&o.repo, "repo", "..", "the Nudge repository, whose cmd/sms-worker and cmd/dispatcher are built")
	flag.StringVar(&o.prof, "cpuprofile", "out/cpu-e2e.pprof", "CPU profile of the first end-to-end run with -profile-workers workers (empty: none)")
	flag.IntVar(&o.profileWorkers, "profile-workers", 2, "worker count of the profiled end-to-end run")
	flag.Float64Var(&o.latencyLoad, "latency-load", 0.5, "latency runs offer this share of the median headline end-to-end throughput")
	flag.Float64Var(&o.latencyRate, "latency-rate", 0, "latency runs offer this many reminders/s instead (0: -latency-load)")
	flag.DurationVar(&o.latencyFor, "latency-for", 12*time.Second, "how long the stream of a latency run lasts")
	flag.DurationVar(&latencyWarmup, "latency-warmup", 2*time.Second, "how long a latency run's stream runs, at the same rate, before the measured reminders are due (the workers' and dispatcher's cold start; left out of every figure)")
	flag.BoolVar(&latencyCheckpoint, "latency-checkpoint", latencyCheckpoint, "a CHECKPOINT before each latency and burst run's stream (after its seeding), so that the WAL of the seeding and of the earlier sections starts no checkpoint in the measured seconds")
	flag.DurationVar(&latencyMinGap, "latency-min-gap", 0, "the dispatcher's --min-gap during latency runs (0: the product's default; the value of -latency-every: a pass on a fixed tick, as before the loop woke when rows are due)")
	flag.DurationVar(&o.latencyEvery, "latency-every", 100*time.Millisecond, "the dispatcher's --every during latency runs")
	flag.StringVar(&sizes, "scale-sizes", "10000,1000000,10000000", "table sizes of the claim-rate-at-scale runs: rows scheduled for later, besides the due rows claimed")
	flag.StringVar(&scrapeSizes, "scrape-sizes", "10000,1000000,10000000", "table sizes of the scrape-and-pass runs (on the scale section's tables, built once for both): pending reminders scheduled from tomorrow on, besides the due sets, of which a backlog of 1,000 is due at the scrape's clock")
	flag.IntVar(&o.controlSize, "control-size", 10000, "rows of the control table built beside every scale and scrape table (scheduled for later, besides the due sets, as the table's)")
	flag.IntVar(&o.scalePerRun, "scale-claims", 5000, "rows claimed per scale run and layout (every table holds 2 × -runs times as many due rows on top of its size)")
	flag.IntVar(&warmup, "warmup", warmup, "reminders (River: jobs) per worker run through every end-to-end run before its clock starts, left out of its figures (0: cold starts)")
	flag.IntVar(&envelopeSize, "envelope-size", envelopeSize, "reminders per broker message of every dispatcher (dispatcher --envelope-size; 1: a message per reminder); the dispatcher-alone section also runs at 1")
	flag.IntVar(&burstEnvelopeSize, "burst-envelope-size", burstEnvelopeSize, "reminders per broker message of every dispatcher while its claims leave due rows behind (dispatcher --burst-envelope-size; 0: the product's default, 200, or 1 at -envelope-size 1)")
	flag.IntVar(&o.batch, "batch", 500, "the dispatcher's batch (scale runs and the dispatcher process)")
	flag.IntVar(&o.procN, "proc-n", 10000, "reminders per run of the real worker and dispatcher processes")
	flag.StringVar(&o.procProfile, "proc-cpuprofile", "", "CPU profile of the first run's sms-worker process (its --cpuprofile; empty: none)")
	flag.IntVar(&o.procPrefetch, "proc-prefetch", 500, "the worker process's --prefetch")
	flag.IntVar(&o.planningN, "planning-n", 5000, "intents per run of the planning section, each of its three ways (the SQL function, one call per reminder, is the slow one)")
	flag.StringVar(&only, "only", strings.Join(allSections, ","), "sections to run: "+strings.Join(allSections, ",")+" (fewer than all: the report and chart go to bench/out unless -out and -chart name them)")
	flag.BoolVar(&o.diagnose, "diagnose", false, "instead of the benchmark: EXPLAIN ANALYZE the dispatcher's statements and sample pg_stat_activity during one e2e run with -profile-workers workers")
	flag.Parse()
	if serveProvider {
		if err := serveFakeProvider(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "nudge-bench -serve-fake-provider:", err)
			os.Exit(1)
		}
		return
	}
	harnessGC = harnessGCDefaults()
	var err error
	if o.workers, err = intList(workers, 1); err != nil {
		fatalUsage("-workers", err)
	}
	if o.scaleSizes, err = intList(sizes, 1); err != nil {
		fatalUsage("-scale-sizes", err)
	}
	if o.scrapeSizes, err = intList(scrapeSizes, 1); err != nil {
		fatalUsage("-scrape-sizes", err)
	}
	o.sections = map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allSections, s) {
			fatalUsage("-only", fmt.Errorf("unknown section %q", s))
		}
		o.sections[s] = true
	}
	if len(o.sections) < len(allSections) {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		o.out, o.chart = partialOutputs(o.out, o.chart, set)
	}
	if warmup < 0 {
		fatalUsage("-warmup", errors.New("must not be negative"))
	}
	if o.runs < 1 {
		fatalUsage("-runs", errors.New("must be at least 1"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "nudge-bench:", err)
		os.Exit(1)
	}
}

// partialOutputs are the report and chart a run of some sections only
// (-only) writes: bench/out's, unless -out or -chart named them, so that a
// partial run never replaces the generated part of docs/benchmarks.md (or its
// chart) with a report most of whose tables say "not run".
func partialOutputs(out, chart string, set map[string]bool) (string, string) {
	if !set["out"] {
		out = filepath.Join("out", "benchmarks-only.md")
	}
	if !set["chart"] {
		chart = filepath.Join("out", "benchmarks-throughput-only.png")
	}
	return out, chart
}

func intList(s string, least int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < least {
			return nil, fmt.Errorf("%q: want integers of at least %d, comma-separated", s, least)
		}
		out = append(out, k)
	}
	return out, nil
}

func fatalUsage(flagName string, err error) {
	fmt.Fprintf(os.Stderr, "nudge-bench: %s: %v\n", flagName, err)
	os.Exit(2)
}

// nFor is the run size for k workers.
func (o options) nFor(k int) int {
	if k == o.headline {
		return o.n
	}
	return o.nOther
}

type results struct {
	raw      []rawResult
	disp     []dispatchResult // at -envelope-size
	disp1    []dispatchResult // a message per reminder (the flag's default in production until every worker is upgraded)
	e2e      map[int][]e2eResult
	sink     []e2eResult           // the headline worker count, in-process sink instead of the fake SMS provider
	river    map[int][]riverResult // River with MaxWorkers riverPerWorker and default fetch settings
	tuned    map[int][]riverResult // River configured as `river bench` configures its client
	latency  []latencyResult
	procs    []procResult
	scale    []scaleResult
	scrape   []scrapeResult
	sched    []riverResult // River, jobs inserted as scheduled, headline worker count
	tunedSMS []riverResult // River tuned, each job sending an SMS to the fake provider, headline worker count
	burst    []latencyResult
	planning []planningResult
	storage  storageResult // after the first headline run
	elapsed  time.Duration
	spent    map[string]time.Duration // wall time by section, seeding and cleanup included
	measured map[string]time.Duration // of which measuring (env.measured), the rest being setup
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
		return fmt.Errorf("PostgreSQL at %s: %w", e.dbURL, err)
	}
	defer e.admin.Close()
	if err := e.admin.Ping(ctx); err != nil {
		return fmt.Errorf("PostgreSQL at %s: %w", e.dbURL, err)
	}
	if o.diagnose {
		return diagnose(ctx, e, o.n, o.profileWorkers)
	}
	m := describe(ctx, e)
	fmt.Printf("nudge-bench: n=%d (headline, %d workers), n-other=%d, runs=%d, workers=%v, sections=%v on %d CPUs, PostgreSQL %s, RabbitMQ %s, %s\n",
		o.n, o.headline, o.nOther, o.runs, o.workers, o.sections, m.CPUs, m.Postgres, m.RabbitMQ, m.Go)
	if o.sections["scale"] || o.sections["scrape"] {
		if err := dropLeftoverScaleSchemas(ctx, e); err != nil {
			return err
		}
	}
	defer dropSeedTemplates()
	r := results{e2e: map[int][]e2eResult{}, river: map[int][]riverResult{}, tuned: map[int][]riverResult{}, spent: map[string]time.Duration{}, measured: map[string]time.Duration{}}
	start := time.Now()
	mark := time.Now()
	lap := func(section string) {
		r.spent[section] += time.Since(mark)
		r.measured[section] += e.takeMeasured()
		mark = time.Now()
	}
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
	if o.prof != "" && o.sections["e2e"] {
		if err := os.MkdirAll(filepath.Dir(o.prof), 0o755); err != nil {
			return fmt.Errorf("profile directory: %w", err)
		}
	}
	var bins *binaries
	if o.sections["procs"] {
		fmt.Println("building cmd/sms-worker and cmd/dispatcher")
		if bins, err = buildBinaries(ctx, o.repo); err != nil {
			return err
		}
		defer bins.remove()
		lap("procs")
	}
	nudgectl := ""
	if o.sections["planning"] {
		fmt.Println("building cmd/nudgectl")
		bin, remove, err := buildNudgectl(ctx, o.repo)
		if err != nil {
			return err
		}
		defer remove()
		nudgectl = bin
		lap("planning")
	}
	if o.sections["latency"] && !o.sections["e2e"] && o.latencyRate <= 0 {
		return errors.New("latency runs without e2e runs need -latency-rate")
	}

	// Interleave the measurements so a slow minute of the machine spreads
	// over all of them rather than skewing one.
	for i := range o.runs {
		fmt.Printf("run %d/%d (%s)\n", i+1, o.runs, time.Since(start).Round(time.Second))
		walDump = i == 0 // pg_waldump takes seconds per 100,000 items: the first run's records stand for all
		if o.sections["raw"] {
			rr, err := rawBroker(ctx, e, o.nDispatch, o.window)
			if err != nil {
				return fmt.Errorf("raw broker: %w", err)
			}
			fmt.Printf("  raw broker: publish %.0f msg/s, consume %.0f msg/s, both at once %.0f msg/s\n", rr.PublishRate, rr.ConsumeRate, rr.BothRate)
			r.raw = append(r.raw, rr)
			lap("raw")
		}
		if o.sections["dispatcher"] {
			dr, err := dispatcherAlone(ctx, e, o.nDispatch, envelopeSize)
			if err != nil {
				return fmt.Errorf("dispatcher alone: %w", err)
			}
			fmt.Printf("  dispatcher alone, envelopes of %s: %.0f reminders/s (%d batches)\n", envelopes(envelopeSize), dr.Rate, dr.Batches)
			r.disp = append(r.disp, dr)
			if envelopeSize != 1 {
				d1, err := dispatcherAlone(ctx, e, o.nDispatch, 1)
				if err != nil {
					return fmt.Errorf("dispatcher alone, a message per reminder: %w", err)
				}
				fmt.Printf("  dispatcher alone, a message per reminder: %.0f reminders/s\n", d1.Rate)
				r.disp1 = append(r.disp1, d1)
			}
			lap("dispatcher")
		}
		if o.sections["e2e"] {
			for _, k := range o.workers {
				prof := ""
				if i == 0 && k == o.profileWorkers && o.prof != "" {
					prof, r.profiled = o.prof, o.prof
				}
				var storage *storageResult
				if i == 0 && k == o.headline {
					storage = &r.storage
				}
				er, err := nudgeE2E(ctx, e, o.nFor(k), k, prof, false, storage)
				if err != nil {
					return fmt.Errorf("nudge e2e, %d workers: %w", k, err)
				}
				fmt.Printf("  nudge e2e, %d workers, n=%d: %.0f reminders/s (%s, %d delivered, p99 claim-to-terminal %.0f ms)\n",
					k, o.nFor(k), er.Rate, er.Elapsed.Round(time.Millisecond), er.Delivered, er.P99)
				fmt.Printf("    CPU-s per 1,000: %s\n", er.CPU.per1000(o.nFor(k)))
				r.e2e[k] = append(r.e2e[k], er)
				if k == o.headline {
					sr, err := nudgeE2E(ctx, e, o.nFor(k), k, "", true, nil)
					if err != nil {
						return fmt.Errorf("nudge e2e with an in-process sink, %d workers: %w", k, err)
					}
					fmt.Printf("  nudge e2e, %d workers, in-process sink, n=%d: %.0f reminders/s\n", k, o.nFor(k), sr.Rate)
					r.sink = append(r.sink, sr)
				}
				lap("e2e")
				for _, cfg := range []riverConfig{riverDefault, riverTuned} {
					vr, err := riverRun(ctx, e, o.nFor(k), k, cfg)
					if err != nil {
						return fmt.Errorf("%s, %d workers: %w", cfg, k, err)
					}
					fmt.Printf("  %s, %d clients, n=%d: %.0f jobs/s (%s)\n", cfg, k, o.nFor(k), vr.Rate, vr.Elapsed.Round(time.Millisecond))
					fmt.Printf("    CPU-s per 1,000: %s\n", vr.CPU.per1000(o.nFor(k)))
					if cfg == riverTuned {
						r.tuned[k] = append(r.tuned[k], vr)
					} else {
						r.river[k] = append(r.river[k], vr)
					}
				}
				if k == o.headline {
					vr, err := riverRun(ctx, e, o.nFor(k), k, riverScheduled)
					if err != nil {
						return fmt.Errorf("%s, %d workers: %w", riverScheduled, k, err)
					}
					fmt.Printf("  %s, %d clients, n=%d: %.0f jobs/s (%s)\n", riverScheduled, k, o.nFor(k), vr.Rate, vr.Elapsed.Round(time.Millisecond))
					r.sched = append(r.sched, vr)
					vr, err = riverRun(ctx, e, o.nFor(k), k, riverTunedSMS)
					if err != nil {
						return fmt.Errorf("%s, %d workers: %w", riverTunedSMS, k, err)
					}
					fmt.Printf("  %s, %d clients, n=%d: %.0f jobs/s (%s)\n", riverTunedSMS, k, o.nFor(k), vr.Rate, vr.Elapsed.Round(time.Millisecond))
					r.tunedSMS = append(r.tunedSMS, vr)
				}
				lap("river")
			}
		}
		if o.sections["latency"] {
			rate := o.latencyRate
			if rate <= 0 {
				rate = o.latencyLoad * pick(r.e2e[o.headline], func(x e2eResult) float64 { return x.Rate }).Median
			}
			lr, err := latencyRun(ctx, e, rate, o.latencyFor, o.headline, o.latencyEvery)
			if err != nil {
				return fmt.Errorf("latency at %.0f/s: %w", rate, err)
			}
			et := lr.Hops[hopEnqueueToTerminal]
			fmt.Printf("  latency, %d workers, offered %.0f/s, achieved %.0f/s: enqueue-to-terminal p50 %.1f ms, p99 %.1f ms, max %.1f ms (CPU pressure %.0f%%, harness waited %s/s for a CPU, load %.1f, %d checkpoints started)\n",
				o.headline, lr.Offered, lr.Achieved, et.P50, et.P99, et.Max, 100*lr.Machine.Pressure, lr.Machine.RunDelay.Round(time.Millisecond), lr.Machine.Load, lr.Checkpoints)
			fmt.Printf("    CPU-s per 1,000: %s\n", lr.CPU.per1000(lr.Delivered))
			for _, h := range latencyHops {
				x := lr.Hops[h]
				fmt.Printf("    %-20s p50 %7.1f ms  p90 %7.1f ms  p99 %7.1f ms  max %7.1f ms\n", h, x.P50, x.P90, x.P99, x.Max)
			}
			r.latency = append(r.latency, lr)
			lap("latency")
		}
		if o.sections["burst"] {
			br, err := burstRun(ctx, e, o.nOther, o.headline, o.latencyEvery)
			if err != nil {
				return fmt.Errorf("burst of %d: %w", o.nOther, err)
			}
			fmt.Printf("  burst, %d workers, %d reminders due in the same second: due → last terminal %s\n",
				o.headline, br.N, br.LastTerminal.Sub(br.FirstDue).Round(time.Millisecond))
			r.burst = append(r.burst, br)
			lap("burst")
		}
		if o.sections["planning"] {
			pr, err := planningRun(ctx, e, nudgectl, o.planningN)
			if err != nil {
				return fmt.Errorf("planning %d intents: %w", o.planningN, err)
			}
			fmt.Printf("  planning, n=%d: one planner %.0f intents/s (%d slices, slice %.1f ms, cycle %.1f ms), nudgectl schedule -f %.0f/s, nudge_schedule per row %.0f/s\n",
				pr.N, pr.PlannerRate, pr.Slices, pr.SliceMs, pr.CycleMs, pr.FileRate, pr.SQLRate)
			fmt.Printf("  intake backend CPU-s per 1000: nudge_schedule once per row %.3f, bulk %.3f (%.2fx), nudge_schedule_many %.3f, one call per transaction %.3f\n",
				pr.FnRowsCPU, pr.BulkCPU, ratio(pr.FnRowsCPU, pr.BulkCPU), pr.ManyCPU, pr.SQLCPU)
			r.planning = append(r.planning, pr)
			lap("planning")
		}
		if o.sections["procs"] {
			prof := ""
			if i == 0 {
				prof = o.procProfile
			}
			pr, err := procRun(ctx, e, bins, o.procN, o.procPrefetch, o.batch, prof)
			if err != nil {
				return fmt.Errorf("worker and dispatcher processes: %w", err)
			}
			fmt.Printf("  processes: sms-worker peak RSS %.1f MiB, CPU %.3f s per 1,000, dispatcher %.1f MiB, %.0f reminders/s, %d connections to the provider\n",
				pr.WorkerMiB, pr.WorkerCPU*1000/float64(o.procN), pr.DispatcherMiB, pr.Rate, pr.ProviderConns)
			r.procs = append(r.procs, pr)
			lap("procs")
		}
	}
	if o.sections["scale"] || o.sections["scrape"] {
		// The two sections share every table: build once, measure both, drop once.
		fmt.Printf("scale and scrape tables (%s)\n", time.Since(start).Round(time.Second))
		st, err := loadStatements(o.repo)
		if err != nil {
			return err
		}
		sizes := tableSizes(o)
		for _, size := range sizes {
			scale := o.sections["scale"] && slices.Contains(o.scaleSizes, size)
			scrape := o.sections["scrape"] && slices.Contains(o.scrapeSizes, size)
			sc, sr, built, err := tableRun(ctx, e, o, st, size, o.controlSize, scale, scrape)
			if err != nil {
				return fmt.Errorf("tables, %d rows: %w", size, err)
			}
			fmt.Printf("  %d rows and the control built in %s\n", size, built.Round(time.Second))
			if sr != nil {
				fmt.Printf("  %d rows (%.0f MiB with indexes): scrape %.1f ms (control %.1f), pass %.1f ms (control %.1f) (medians of %d); every open row counted (before 0023) %.1f ms\n",
					size, float64(sr.TotalBytes)/(1<<20),
					summarize(sr.ScrapeMs).Median, summarize(sr.CtlScrapeMs).Median,
					summarize(sr.PassMs).Median, summarize(sr.CtlPassMs).Median, scrapeTimes, summarize(sr.CountMs).Median)
				for i, pl := range sr.Plans {
					c := sr.CtlPlans[i]
					fmt.Printf("    %s: planning %.2f ms (%d hit, %d read) vs control %.2f ms (%d, %d); execution %.2f ms (%d hit, %d read) vs control %.2f ms (%d, %d)\n",
						pl.Name, pl.PlanningMs, pl.PlanHit, pl.PlanRead, c.PlanningMs, c.PlanHit, c.PlanRead,
						pl.ExecutionMs, pl.Hit, pl.Read, c.ExecutionMs, c.Hit, c.Read)
				}
				if err := writePlans(o, sr); err != nil {
					return err
				}
				r.scrape = append(r.scrape, *sr)
			}
			if sc != nil {
				fmt.Printf("  %d rows (loaded in %s, indexed in %s, %.0f MiB with indexes, claim cost estimate %.0f, JIT %v): claimed rows/s, median, vs the %d-row control: clustered %.0f vs %.0f, spread %.0f vs %.0f\n",
					size, sc.Load.Round(time.Second), sc.Index.Round(time.Second), float64(sc.TotalBytes)/(1<<20), sc.Plan.Cost, sc.Plan.JIT, sc.ControlSize,
					summarize(sc.Clustered.Rates).Median, summarize(sc.ControlClustered.Rates).Median,
					summarize(sc.Spread.Rates).Median, summarize(sc.ControlSpread.Rates).Median)
				r.scale = append(r.scale, *sc)
			}
			lap("scale+scrape")
		}
	}
	r.elapsed = time.Since(start)
	stopLoad()
	<-loadDone
	fmt.Printf("done in %s (%s)\n", r.elapsed.Round(time.Second), r.spentLine())
	fmt.Printf("setup / measurement by section: %s\n", r.splitLine())
	return report(o, m, r)
}

// sectionOrder names the sections of the wall-time lines, in the order they run.
var sectionOrder = []string{"raw", "dispatcher", "e2e", "river", "latency", "burst", "procs", "planning", "scale+scrape"}

// spentLine lists the wall time by section, in the order they run.
func (r results) spentLine() string {
	var parts []string
	for _, s := range sectionOrder {
		if d, ok := r.spent[s]; ok {
			parts = append(parts, fmt.Sprintf("%s %s", s, d.Round(time.Second)))
		}
	}
	return strings.Join(parts, ", ")
}

// splitLine lists each section's wall time as setup / measurement: the
// measurement from the moment a run's clock starts to the moment the harness
// sees it end (env.measuredSince), the setup everything else (schemas,
// seeding, warm-ups, table builds, WAL counting, building binaries, cleanup).
func (r results) splitLine() string {
	var parts []string
	for _, s := range sectionOrder {
		if d, ok := r.spent[s]; ok {
			m := r.measured[s]
			parts = append(parts, fmt.Sprintf("%s %s / %s", s, (d-m).Round(time.Second), m.Round(time.Second)))
		}
	}
	return strings.Join(parts, ", ")
}

// tableSizes are the sizes of the tables the scale and scrape sections
// build, ascending.
func tableSizes(o options) []int {
	var sizes []int
	if o.sections["scale"] {
		sizes = append(sizes, o.scaleSizes...)
	}
	if o.sections["scrape"] {
		sizes = append(sizes, o.scrapeSizes...)
	}
	slices.Sort(sizes)
	return slices.Compact(sizes)
}

// writePlans writes the scrape's and the pass's plans on a table and its
// control next to the CPU profile (bench/out), for reading.
func writePlans(o options, sr *scrapeResult) error {
	dir := "out"
	if o.prof != "" {
		dir = filepath.Dir(o.prof)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	for i, pl := range sr.Plans {
		fmt.Fprintf(&b, "==== %s, %d rows\n%s\n\n==== %s, control\n%s\n\n", pl.Name, sr.Size, pl.Text, pl.Name, sr.CtlPlans[i].Text)
	}
	return os.WriteFile(filepath.Join(dir, fmt.Sprintf("scrape-plans-%d.txt", sr.Size)), []byte(b.String()), 0o644)
}

// workerGCPercent is the worker binaries' GOGC, internal/config's
// WorkerGCPercent (not imported: internal/config brings the mail client's
// module into this one).
const workerGCPercent = 200

// harnessGC is the collector target (GOGC) the harness process runs with,
// for the report.
var harnessGC string

// harnessGCDefaults sets the harness process's GOGC to the worker
// binaries' (workerGCPercent) unless the environment sets one, and
// says which applies. The in-process workers are what the end-to-end
// sections measure, and a deployed worker collects at that target
// (cmd/sms-worker: config.GCDefaults); at Go's default of 100 the harness
// paid for twice the collections a worker does. The River clients share the
// process, and the setting. The workers' soft memory limit is left out: it
// bounds one worker's heap, and this process holds several workers, the
// dispatcher and the seeding, so under it the collector would run back to
// back (docs/benchmarks.md, "The Go share of CPU per delivered reminder").
func harnessGCDefaults() string {
	if v, ok := os.LookupEnv("GOGC"); ok {
		return v + " (from the environment)"
	}
	debug.SetGCPercent(workerGCPercent)
	return strconv.Itoa(workerGCPercent) + " (the worker binaries' config.WorkerGCPercent)"
}
