package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/riverqueue/river"

	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/metrics"
)

func pick[T any](xs []T, f func(T) float64) stats {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	return summarize(v)
}

func fmtS(s stats) string   { return fmt.Sprintf("%.0f | %.0f | %.0f", s.Median, s.Min, s.Max) }
func fmtSf(s stats) string  { return fmt.Sprintf("%.1f | %.1f | %.1f", s.Median, s.Min, s.Max) }
func fmtSf2(s stats) string { return fmt.Sprintf("%.2f | %.2f | %.2f", s.Median, s.Min, s.Max) }
func fmtSf3(s stats) string { return fmt.Sprintf("%.3f | %.3f | %.3f", s.Median, s.Min, s.Max) }

// fmtR is a median with its range in one cell: "23.4 (20.1–30.2)".
func fmtR(s stats, prec int) string {
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, s.Median, prec, s.Min, prec, s.Max)
}

// thousands writes n with thousands separators.
func thousands(n int) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// rowsLabel is a table size as the issue names it: 10k, 1M, 10M.
func rowsLabel(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return thousands(n)
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

const notRun = "not run (`-only`)"

func report(o options, m machine, r results) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	groups := make([]string, len(o.workers))
	var nudgeS, riverS, tunedS []stats
	for i, k := range o.workers {
		groups[i] = fmt.Sprintf("%d worker(s), N=%s", k, rowsLabel(o.nFor(k)))
		nudgeS = append(nudgeS, pick(r.e2e[k], func(x e2eResult) float64 { return x.Rate }))
		riverS = append(riverS, pick(r.river[k], func(x riverResult) float64 { return x.Rate }))
		tunedS = append(tunedS, pick(r.tuned[k], func(x riverResult) float64 { return x.Rate }))
	}
	if o.chart != "" && o.sections["e2e"] {
		if err := os.MkdirAll(filepath.Dir(o.chart), 0o755); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		if err := drawChart(o.chart, "Throughput vs workers (Nudge reminders/s end to end; River no-op jobs/s)",
			groups, []series{
				{Name: "Nudge end to end", Color: color.RGBA{52, 101, 164, 255}, Vals: nudgeS},
				{Name: "River, default fetch, 200 workers", Color: color.RGBA{245, 121, 0, 255}, Vals: riverS},
				{Name: "River tuned as river bench", Color: color.RGBA{115, 210, 22, 255}, Vals: tunedS},
			}); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
	}
	rawPub := pick(r.raw, func(x rawResult) float64 { return x.PublishRate })
	rawCon := pick(r.raw, func(x rawResult) float64 { return x.ConsumeRate })
	rawBoth := pick(r.raw, func(x rawResult) float64 { return x.BothRate })
	disp := pick(r.disp, func(x dispatchResult) float64 { return x.Rate })
	disp1 := pick(r.disp1, func(x dispatchResult) float64 { return x.Rate })

	p("# Benchmarks\n\n")
	p("Written by `make bench` (`bench/cmd/nudge-bench`, a module of its own so River never enters the main module) on %s, in %s.\n\n",
		m.When.Format("2006-01-02 15:04 UTC"), r.elapsed.Round(time.Second))
	p("Wall time by section, seeding and cleanup included: %s (procs includes building the binaries).\n\n", r.spentLine())
	p("Of which setup / measurement (the measurement from each run's clock start until the harness sees its end; the setup is the rest: schemas, seeding, warm-ups, table builds, WAL counting, building binaries, cleanup): %s.\n\n", r.splitLine())
	p("Every schema is migrated as production runs once this release is rolled out: every migration, the after-rollout ones included, then lazy intake on (a horizon of 2 hours, reminders due later get their state row from the dispatcher's promoter) and `reminder_state`'s foreign key dropped, as schema 44's after-rollout step does. The end-to-end, latency and burst reminders are due within the horizon, so intake gives each its state row; the scale tables (sections 4 and 4b) hold reminders scheduled for later without one.\n\n")
	p("Every figure is the **median of %d runs** with min and max. The runs are interleaved (run 1 of everything, then run 2, …) so a slow minute of the machine spreads over all measurements; the table-scale runs come last, one table size at a time (%d runs on each table).\n\n", o.runs, o.runs)
	p("Sizes: N = %s reminders (and River jobs) per run for the headline comparison at %d workers; N = %s for the other worker counts and the burst; %s for the raw broker and the dispatcher alone; %s per run of the real worker and dispatcher processes. ",
		thousands(o.n), o.headline, thousands(o.nOther), thousands(o.nDispatch), thousands(o.procN))
	if o.nOther < o.n {
		p("N = %s × %d runs × every configuration does not fit in the 15 minutes `make bench` may take on this 2-core machine, so only the headline runs at the full size (`make bench BENCH_N_OTHER=%d` runs everything at it, in well over 15 minutes).\n\n", thousands(o.n), o.runs, o.n)
	} else {
		p("\n\n")
	}
	p("## Machine\n\n| | |\n|---|---|\n")
	p("| CPUs (nproc) | %d × %s |\n| memory | %.1f GiB |\n| kernel | %s |\n| Go | %s |\n| PostgreSQL | %s (same machine), `shared_buffers` %s, %s |\n| RabbitMQ | %s (same machine) |\n\n",
		m.CPUs, m.CPUModel, m.MemGiB, m.Kernel, m.Go, m.Postgres, m.SharedBuffers, m.JIT, m.RabbitMQ)
	ls := summarize(r.loads)
	p("Load average (1 min) sampled every 5 s during the run: median %.1f, min %.1f, max %.1f on %d CPUs. ", ls.Median, ls.Min, ls.Max, m.CPUs)
	p("The CPU tables count the seconds other processes on the machine used during each measurement (\"other\"): anything well above zero means the figures were taken on a shared machine and are noisier than the ratios.\n\n")

	// ------------------------------------------------------------ targets
	p("## Targets (measured in the same run)\n\n| target | measured (median) | met |\n|---|---|---|\n")
	if o.sections["e2e"] {
		for i, k := range o.workers {
			rt := ratio(nudgeS[i].Median, riverS[i].Median)
			target := ""
			if k == o.headline {
				target = " (the target)"
			}
			p("| Nudge e2e / River, %d worker(s)%s, N=%s ≥ 1.0 | %.2f (%.0f / %.0f) | %s |\n", k, target, rowsLabel(o.nFor(k)),
				rt, nudgeS[i].Median, riverS[i].Median, yes(rt >= 1.0))
			if k == o.headline && len(r.sink) > 0 {
				ss := pick(r.sink, func(x e2eResult) float64 { return x.Rate })
				rs := ratio(ss.Median, riverS[i].Median)
				p("| same, Nudge sending to an in-process sink (no HTTP hop, as River's no-op jobs) | %.2f (%.0f [%.0f–%.0f] / %.0f) | %s |\n",
					rs, ss.Median, ss.Min, ss.Max, riverS[i].Median, yes(rs >= 1.0))
			}
			rt = ratio(nudgeS[i].Median, tunedS[i].Median)
			p("| Nudge e2e / River tuned as `river bench`, %d worker(s)%s, N=%s ≥ 1.0 | %.2f (%.0f / %.0f) | %s |\n", k, target, rowsLabel(o.nFor(k)),
				rt, nudgeS[i].Median, tunedS[i].Median, yes(rt >= 1.0))
			sinkTuned := 0.0 // the sink's rate over River tuned's, the headline only
			if k == o.headline && len(r.sink) > 0 {
				ss := pick(r.sink, func(x e2eResult) float64 { return x.Rate })
				sinkTuned = ratio(ss.Median, tunedS[i].Median)
				p("| same, Nudge sending to an in-process sink | %.2f (%.0f [%.0f–%.0f] / %.0f) | %s |\n",
					sinkTuned, ss.Median, ss.Min, ss.Max, tunedS[i].Median, yes(sinkTuned >= 1.0))
			}
			if k == o.headline {
				// Issue 18's bars for the headline run. The bar was set on
				// the first row (the HTTP provider against no-op jobs),
				// which the two rows after it split into the same work on
				// both sides.
				p("| Nudge e2e / River tuned as `river bench`, issue 18's bar ≥ 0.5 (Nudge sending over HTTP, River's jobs doing nothing) | %.2f | %s |\n", rt, yes(rt >= 0.5))
				if len(r.sink) > 0 {
					p("| same work, no provider: Nudge with the in-process sink / River tuned's no-op jobs ≥ 0.5 | %.2f | %s |\n", sinkTuned, yes(sinkTuned >= 0.5))
				}
				if len(r.tunedSMS) > 0 {
					ts := pick(r.tunedSMS, func(x riverResult) float64 { return x.Rate })
					rs := ratio(nudgeS[i].Median, ts.Median)
					p("| same work, the HTTP provider: Nudge / River tuned with each job sending its SMS through the same client to the same fake provider ≥ 0.5 | %.2f (%.0f / %.0f [%.0f–%.0f]) | %s |\n",
						rs, nudgeS[i].Median, ts.Median, ts.Min, ts.Max, yes(rs >= 0.5))
				}
				if len(r.sched) > 0 {
					ss := pick(r.sched, func(x riverResult) float64 { return x.Rate })
					rs := ratio(nudgeS[i].Median, ss.Median)
					p("| Nudge e2e / River with jobs inserted as scheduled, %d worker(s), N=%s ≥ 1.0 | %.2f (%.0f / %.0f) | %s |\n", k, rowsLabel(o.nFor(k)),
						rs, nudgeS[i].Median, ss.Median, yes(rs >= 1.0))
				}
				c := summarizeCosts(nudgeCosts(r.e2e[k]), o.nFor(k))
				p("| total CPU-s per 1,000 delivered reminders, %d worker(s), HTTP provider ≤ 0.15: PostgreSQL + RabbitMQ + Go (the harness: dispatcher, workers, the HTTP client), not the fake provider's process | %.3f (PostgreSQL %.3f, RabbitMQ %.3f, Go %.3f; besides: fake provider %.3f, all-in %.3f) | %s |\n", k,
					c.Total(), c.Postgres, c.RabbitMQ, c.Harness, c.Provider, c.AllIn(), yes(c.Total() <= 0.15))
				if c.HasRecords {
					p("| WAL per delivered reminder ≤ 2,200 bytes | %.0f bytes (%.1f records) | %s |\n", c.RecordBytes, c.Records, yes(c.RecordBytes <= 2200))
				}
			}
		}
	} else {
		p("| Nudge e2e / River ≥ 1.0 | %s | – |\n", notRun)
	}
	dr := ratio(disp.Median, rawPub.Median)
	if o.sections["raw"] && o.sections["dispatcher"] {
		// The ratio of the medians is judged; the runs' own ratios (each
		// pair measured in the same minute of the machine) are shown beside
		// it, since the raw publish lasts a fraction of a second.
		byRun := pairedRatios(r.disp, r.raw, func(d dispatchResult) float64 { return d.Rate }, func(x rawResult) float64 { return x.PublishRate })
		p("| dispatcher claim-publish-record (envelopes of %s) / raw publish ≥ 0.80 | %.2f (%.0f / %.0f; run by run %s) | %s |\n", envelopes(envelopeSize), dr, disp.Median, rawPub.Median, byRun, yes(dr >= 0.8))
		if len(r.disp1) > 0 {
			d1 := ratio(disp1.Median, rawPub.Median)
			p("| same, a message per reminder / raw publish ≥ 0.80 | %.2f (%.0f / %.0f) | %s |\n", d1, disp1.Median, rawPub.Median, yes(d1 >= 0.8))
		}
	} else {
		p("| dispatcher claim-publish-record / raw publish ≥ 0.80 | %s | – |\n", notRun)
	}
	if len(r.scale) > 0 {
		big := r.scale[len(r.scale)-1]
		for _, l := range []struct {
			name     string
			big, ctl scaleLayout
		}{{"clustered", big.Clustered, big.ControlClustered}, {"spread", big.Spread, big.ControlSpread}} {
			bg, sm := summarize(l.big.Rates).Median, summarize(l.ctl.Rates).Median
			rt := ratio(bg, sm)
			p("| claim rate at %s rows within 20%% of %s (≥ 0.80×), due rows %s (lazy layout, promoted before) | %.2f (%.0f / %.0f rows/s) | %s |\n",
				rowsLabel(big.Size), rowsLabel(big.ControlSize), l.name, rt, bg, sm, yes(rt >= 0.8))
		}
		for _, l := range []struct {
			name     string
			big, ctl scaleLayout
		}{{"clustered", big.Clustered, big.ControlClustered}, {"spread", big.Spread, big.ControlSpread}} {
			bg, sm := summarize(l.big.promoteClaimRates()).Median, summarize(l.ctl.promoteClaimRates()).Median
			rt := ratio(bg, sm)
			p("| promote+claim rate at %s rows within 20%% of %s (≥ 0.80×), due rows %s (the promoter's time counted) | %.2f (%.0f / %.0f rows/s) | %s |\n",
				rowsLabel(big.Size), rowsLabel(big.ControlSize), l.name, rt, bg, sm, yes(rt >= 0.8))
		}
	} else {
		p("| claim rate at 10M rows within 20%% of 10k | %s | – |\n", notRun)
	}
	if len(r.scrape) > 0 {
		big := r.scrape[len(r.scrape)-1]
		for _, x := range []struct {
			name     string
			big, ctl []float64
		}{{"a metrics scrape", big.ScrapeMs, big.CtlScrapeMs}, {"a reconciler pass", big.PassMs, big.CtlPassMs}} {
			bg, sm := summarize(x.big).Median, summarize(x.ctl).Median
			rt := ratio(bg, sm)
			p("| %s with %s reminders scheduled for later within 2× of %s (≤ 2.0×) | %.2f (%.1f / %.1f ms) | %s |\n",
				x.name, rowsLabel(big.Size), rowsLabel(o.controlSize), rt, bg, sm, yes(rt <= 2))
		}
	} else {
		p("| a metrics scrape and a reconciler pass at 10M within 2× of 10k | %s | – |\n", notRun)
	}
	if len(r.planning) > 0 {
		fn := pick(r.planning, func(x planningResult) float64 { return x.FnRowsCPU })
		bulk := pick(r.planning, func(x planningResult) float64 { return x.BulkCPU })
		rt := pick(r.planning, func(x planningResult) float64 { return ratio(x.FnRowsCPU, x.BulkCPU) })
		p("| intake by the SQL function (`nudge_schedule` once per row, statements of %s rows) / the bulk path (`intake.ScheduleMany`, same rows), PostgreSQL backend CPU ≤ 1.5× | %.2f (runs: %.2f–%.2f; %.3f / %.3f CPU-s per 1,000) | %s |\n",
			thousands(intakeCPUStatement), rt.Median, rt.Min, rt.Max, fn.Median, bulk.Median, yes(rt.Median <= 1.5))
	} else {
		p("| intake by the SQL function / the bulk path, backend CPU ≤ 1.5× | %s | – |\n", notRun)
	}
	if len(r.latency) > 0 {
		s := pick(r.latency, func(x latencyResult) float64 { return x.Hops[hopEnqueueToTerminal].P99 })
		rate := pick(r.latency, func(x latencyResult) float64 { return x.Offered })
		p("| p99 enqueue-to-terminal < 50 ms at %.0f%% load | %.1f ms (runs: %.1f–%.1f) at %.0f reminders/s, %d workers | %s |\n",
			100*o.latencyLoadShare(), s.Median, s.Min, s.Max, rate.Median, o.headline, yes(s.Median < 50))
	} else {
		p("| p99 enqueue-to-terminal < 50 ms at 50%% load | %s | – |\n", notRun)
	}
	if len(r.procs) > 0 {
		s := pick(r.procs, func(x procResult) float64 { return x.WorkerMiB })
		p("| worker peak RSS < 64 MiB (prefetch %d; judged on the largest run) | %.1f MiB (runs: %.1f–%.1f) | %s |\n",
			o.procPrefetch, s.Median, s.Min, s.Max, yes(s.Max < 64))
	} else {
		p("| worker peak RSS < 64 MiB | %s | – |\n", notRun)
	}
	p("\n")

	// ------------------------------------------------------------ e2e
	p("## 1. End to end: Nudge vs River\n\n")
	if !o.sections["e2e"] {
		p("%s.\n\n", notRun)
	} else {
		p("![Throughput vs worker count, Nudge vs River](benchmarks-throughput.png)\n\n")
		p("Nudge: N SMS reminders already due, one dispatcher pass (`Dispatcher.RunOnce`, batch 500, envelopes of %s (`--envelope-size`, `--burst-envelope-size` while a claim leaves due rows behind); run again if it fails, as its loop would) and k **in-process** `worker.Worker` instances (default config: concurrency 4, batch 50, prefetch 400), each with its own PostgreSQL pool and AMQP connections, sending to the fake SMS provider (`fakesms.New()` in a process of its own, this binary run with `-serve-fake-provider`, answering at once, over loopback HTTP with a pooled transport; served by `fakesms.FastServer`, whose short path answers the sends as net/http's server would, byte for byte, at about half its CPU, a change to the harness since 2026-12-02 that leaves more of the 2 cores to Nudge). The harness process runs with GOGC=%s, as a deployed worker collects (the River clients below share the process and the setting). Rate = N / (first claim event → last terminal event), both from the event trail (`reminder_timeline`: stored and folded events). Every reminder delivered in every run: %s.\n\n", envelopes(envelopeSize), harnessGC, yes(allDelivered(o, r)))
		p("River %s: the same N no-op jobs inserted with `InsertMany` (before the clock starts: once per run of this command into a template schema, then copied into each run's schema as `InsertMany` stores them, created at the copy; `RiverSeedCopy`) and worked by k `river.Client`s, each with its own pool, in two configurations run one after the other for every worker count and run:\n\n", riverVersion)
		p("- **River, default fetch settings**: `MaxWorkers` %d per client (the in-flight capacity of one Nudge worker: 4 × 50), `FetchCooldown` and `FetchPollInterval` left at River's defaults (%s and %s). The configuration earlier reports measured.\n", riverPerWorker, river.FetchCooldownDefault, river.FetchPollIntervalDefault)
		p("- **River tuned as `river bench`**: every client configured as River's own benchmark command (`river bench`, `cmd/river/riverbench/river_bench.go` in riverqueue/river) configures its one client, which its comments say performs much better than the client's defaults: `FetchCooldown: %s`, `FetchPollInterval: %s`, `Queues: {river.QueueDefault: {MaxWorkers: %s}}` (per client, so k × %s in all).\n\n",
			riverBenchFetchCooldown, riverBenchFetchPollInterval, thousands(riverBenchMaxWorkers), thousands(riverBenchMaxWorkers))
		p("With the default settings a client fetches at most its free `MaxWorkers` slots per fetch and waits `FetchCooldown` before the next one, so with no-op jobs it cannot exceed about %d / %s = %s jobs/s per client: where the default rows come close to k times that, they measure River's fetch limits rather than its capacity on this machine.\n\n",
			riverPerWorker, river.FetchCooldownDefault, thousands(int(float64(riverPerWorker)/river.FetchCooldownDefault.Seconds())))
		p("Rate = N / (first `attempted_at` → last `finalized_at`). Nudge / this: the median Nudge rate over this row's median.\n\n")
		if warmup > 0 {
			p("**Warm start** (`-warmup %s`): before each run's clock starts, %s reminders per worker go through the same dispatcher and workers (seeded once and copied, as the measured ones; and %s jobs per client through the same River clients, in a queue of their own, before the measured queue is added to them; not River's jobs inserted as scheduled, whose window still opens with their clients' start: warm clients would open it at a random moment of the scheduler's interval), so the measured window holds the steady state and no connection's start: a Nudge worker connection's first statements cost PostgreSQL ~70 ms of CPU (backend, catalog caches, preparation, first plans), which at 4 workers and N = 10,000 was over a quarter of a cold run's CPU. The warm-up's rows and jobs are left out of every figure; `-warmup 0` measures cold starts.\n\n",
				thousands(warmup), thousands(warmup), thousands(warmup))
		}
		p("| workers | N | system | per second, median | min | max | Nudge / this |\n|---|---|---|---|---|---|---|\n")
		for i, k := range o.workers {
			p("| %d | %s | Nudge, reminders | %s | – |\n", k, thousands(o.nFor(k)), fmtS(nudgeS[i]))
			p("| %d | %s | River, default fetch settings, jobs | %s | %.2f |\n", k, thousands(o.nFor(k)), fmtS(riverS[i]), ratio(nudgeS[i].Median, riverS[i].Median))
			p("| %d | %s | River tuned as `river bench`, jobs | %s | %.2f |\n", k, thousands(o.nFor(k)), fmtS(tunedS[i]), ratio(nudgeS[i].Median, tunedS[i].Median))
			if k == o.headline && len(r.sched) > 0 {
				ss := pick(r.sched, func(x riverResult) float64 { return x.Rate })
				p("| %d | %s | River, jobs inserted as scheduled, default settings | %s | %.2f |\n", k, thousands(o.nFor(k)), fmtS(ss), ratio(nudgeS[i].Median, ss.Median))
			}
			if k == o.headline && len(r.tunedSMS) > 0 {
				ts := pick(r.tunedSMS, func(x riverResult) float64 { return x.Rate })
				p("| %d | %s | River tuned as `river bench`, each job sending an SMS to the fake provider | %s | %.2f |\n", k, thousands(o.nFor(k)), fmtS(ts), ratio(nudgeS[i].Median, ts.Median))
			}
		}
		p("\nThe **each job sending an SMS** row (headline worker count only) is River tuned as above whose jobs do what a Nudge worker does for a reminder at the provider: each job sends the SMS of the reminder with its number (same recipient, template, data and idempotency key) through the same client (`sms.New`'s default, as the `sms-worker` binary wires it) to the same fake provider in a process of its own, and fails if the send fails. The no-op rows measure River's queue alone, so Nudge's HTTP row against them compares different work (a provider round trip per reminder against none); this row and the in-process sink row against the no-op jobs are the two same-work comparisons. River's client side of the send runs in the harness process, as Nudge's does, and the fake's CPU is counted apart (its own column).\n")
		p("\nThe **inserted as scheduled** row (headline worker count only) inserts every job with `ScheduledAt` a second in the past, so it is stored `scheduled`, as a reminder is stored pending before it is due: River's scheduler (run by the elected leader, every few seconds, in batches) moves the jobs to `available` before any client can work them, as Nudge's dispatcher claims its due rows; its rate is N / (clients started → last `finalized_at`), since the moves come before the first attempt.\n")
		p("\n%s", failedPassesNote(func(yield func([]string) bool) {
			for _, k := range o.workers {
				for _, x := range r.e2e[k] {
					if !yield(x.FailedPasses) {
						return
					}
				}
			}
		}, "end-to-end"))
		p("\n### CPU seconds per 1,000 (median), from /proc\n\n")
		p("Sampled from `/proc/*/stat` before and after each run: `postgres` processes, RabbitMQ (`beam.smp` and helpers), the harness process (which hosts the Nudge dispatcher and workers, with the client side of their HTTP calls — or the River clients), and the fake SMS provider's process (this binary again, `-serve-fake-provider`: the server side of the HTTP calls, which in production is the provider's machine, over loopback as before; `fakesms.FastServer` since 2026-12-02, about half the CPU per send of net/http's server, so its column and all-in read lower than before for the same Nudge). **total** is PostgreSQL + RabbitMQ + the harness; **all-in** adds the fake provider, which the harness process hosted until 2026-12-02 and its total then counted. Each process counts its own CPU between the two readings (one started in between, all of it); a backend that exits during a run counts what the postmaster reaped of it (its `cutime`) less what it had used before the run. The PostgreSQL and RabbitMQ columns count the whole servers, so on a shared machine they include other users' work: River's RabbitMQ column, which should be zero, shows how much.\n\n")
		p("WAL per item, from `pg_waldump` over the run's LSN range (`pg_current_wal_lsn()` before and after): the records that touch a relation of the run's own schema (its tables, indexes and their TOAST; commit records name no relation and are not counted) and their bytes, so other work on the server does not count (counted in the first run only: reading the WAL takes seconds per 100,000 items; a temporary replication slot keeps the run's segments until they are read); and, for reference, every byte the cluster wrote in that range, which on a shared server includes everyone else's. ")
		if walNote != "" {
			p("Records were not counted in this run: %s.", walNote)
		}
		p("\n\n**of it, backends** is the part of the PostgreSQL column its client backends used, the statements (the rest: autovacuum workers, the server's own processes and those that exited in the run; section \"PostgreSQL's share by process\" below).")
		p("\n\n| system | workers | PostgreSQL | of it, backends | RabbitMQ | Nudge/River process | total | fake provider | all-in | other processes (noise) | WAL records per item | their bytes per item | cluster WAL bytes per item |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		cpuRow := func(system string, k int, runs []runCost) {
			c := summarizeCosts(runs, o.nFor(k))
			recs, recBytes := "–", "–"
			if c.HasRecords {
				recs, recBytes = fmt.Sprintf("%.1f", c.Records), fmt.Sprintf("%.0f", c.RecordBytes)
			}
			provider, allIn := "–", "–"
			if c.Provider > 0 {
				provider, allIn = fmt.Sprintf("%.3f", c.Provider), fmt.Sprintf("%.3f", c.AllIn())
			}
			p("| %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %s | %s | %.3f | %s | %s | %.0f |\n", system, k, c.Postgres, c.PGBackends, c.RabbitMQ, c.Harness, c.Total(), provider, allIn, c.Other, recs, recBytes, c.ClusterBytes)
		}
		for _, k := range o.workers {
			cpuRow("Nudge", k, nudgeCosts(r.e2e[k]))
			cpuRow("River, default fetch settings", k, riverCosts(r.river[k]))
			cpuRow("River tuned as `river bench`", k, riverCosts(r.tuned[k]))
			if k == o.headline && len(r.sched) > 0 {
				cpuRow("River, jobs inserted as scheduled", k, riverCosts(r.sched))
			}
			if k == o.headline && len(r.tunedSMS) > 0 {
				cpuRow("River tuned, each job sending an SMS", k, riverCosts(r.tunedSMS))
			}
		}
		p("\n### Claim-to-terminal latency under saturation (not the 50%%-load target)\n\n")
		p("Per reminder, claim event (`pending → enqueued`) → terminal event, with the whole backlog due at once, so this is mostly queueing time; the latency at 50%% load is section 3.\n\n")
		p("| workers | N | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|\n")
		for _, k := range o.workers {
			p("| %d | %s | %.0f | %.0f | %.0f |\n", k, thousands(o.nFor(k)),
				pick(r.e2e[k], func(x e2eResult) float64 { return x.P50 }).Median,
				pick(r.e2e[k], func(x e2eResult) float64 { return x.P99 }).Median,
				pick(r.e2e[k], func(x e2eResult) float64 { return x.Max }).Median)
		}
		p("\n")
	}

	// ------------------------------------------------------------ dispatcher vs raw
	p("## 2. Dispatcher alone vs raw broker\n\n")
	p("N = %s. Dispatcher alone: one `RunOnce` (batch 500) over N due reminders with no consumer: claim (one statement per batch: rows to `enqueued` under a dispatch lease) + sign + publish with confirms and `mandatory` (envelopes of %s: `--envelope-size`, `--burst-envelope-size` while a claim leaves due rows behind; and, in a row of its own, a message per reminder, `--envelope-size 1`) + record the batch's publish confirmation (one row per batch); rate = confirmed / run time.\n", thousands(o.nDispatch), envelopes(envelopeSize))
	p("Raw broker: N persistent 100-byte messages to a quorum queue of its own, publisher confirms in windows of %d; then consumed with manual acks (one `basic.ack` per message, prefetch %d). ", o.window, o.window)
	p("Then at once, on another quorum queue of its own: a publisher (same messages, same confirm windows) and a consumer (same acks and prefetch, subscribed before the first publish), each over a connection of its own, N messages through (the issue's 17,000 msg/s reference); rate = N / (first publish → last ack).\n\n")
	p("| measurement | median | min | max |\n|---|---|---|---|\n")
	if o.sections["raw"] {
		p("| raw publish with confirms, msg/s | %s |\n", fmtS(rawPub))
		p("| raw consume with manual ack, msg/s | %s |\n", fmtS(rawCon))
		p("| raw publish and consume at once, msg/s | %s |\n", fmtS(rawBoth))
	} else {
		p("| raw broker | %s | | |\n", notRun)
	}
	if o.sections["dispatcher"] {
		p("| dispatcher claim-publish-record, envelopes of %s, reminders/s | %s |\n", envelopes(envelopeSize), fmtS(disp))
		if len(r.disp1) > 0 {
			p("| dispatcher claim-publish-record, a message per reminder, reminders/s | %s |\n", fmtS(disp1))
		}
	} else {
		p("| dispatcher | %s | | |\n", notRun)
	}
	if o.sections["raw"] && o.sections["dispatcher"] {
		p("| dispatcher / raw publish | %.2f | | |\n", dr)
	}
	p("\n")

	// ------------------------------------------------------------ latency
	p("## 3. Latency at %.0f%% load\n\n", 100*o.latencyLoadShare())
	if len(r.latency) == 0 {
		p("%s.\n\n", notRun)
	} else {
		reportLatency(p, o, r)
	}

	// ------------------------------------------------------------ scale
	p("## 4. Claim rate with the table at scale\n\n")
	if len(r.scale) == 0 {
		p("%s.\n\n", notRun)
	} else {
		reportScale(p, o, m, r)
	}
	p("## 3b. A burst: N reminders due in the same second\n\n")
	if len(r.burst) == 0 {
		p("%s.\n\n", notRun)
	} else {
		reportBurst(p, o, r)
	}
	p("## 4b. A metrics scrape and a reconciler pass at scale\n\n")
	if len(r.scrape) == 0 {
		p("%s.\n\n", notRun)
	} else {
		reportScrape(p, o, r)
	}

	p("## 4d. Storage per reminder over the retention windows\n\n")
	if len(r.storage.Stages) == 0 {
		p("%s.\n\n", notRun)
	} else {
		reportStorage(p, r.storage)
	}

	p("## 4c. Planning a campaign: intents per second\n\n")
	if len(r.planning) == 0 {
		p("%s.\n\n", notRun)
	} else {
		reportPlanning(p, r)
	}

	// ------------------------------------------------------------ memory
	p("## 5. Memory and CPU of the real processes\n\n")
	if len(r.procs) == 0 {
		p("%s.\n\n", notRun)
	} else {
		reportProcs(p, o, r)
	}
	if o.sections["dispatcher"] || o.sections["e2e"] {
		p("### Harness RSS (rough proxy)\n\n")
		p("Peak RSS (`VmHWM`, reset through `/proc/self/clear_refs` before each run) of the **harness process** during the in-process runs above, which host the dispatcher and the workers in one process (the fake SMS provider, which keeps every message it accepted, has a process of its own since 2026-12-02: earlier figures included it, most of their growth with N); the per-process figures are the table above.\n\n")
		p("| run | N | peak RSS MiB median | min | max |\n|---|---|---|---|---|\n")
		if o.sections["dispatcher"] {
			p("| dispatcher alone | %s | %s |\n", thousands(o.nDispatch), fmtSf(pick(r.disp, func(x dispatchResult) float64 { return x.RSS })))
		}
		if o.sections["e2e"] {
			for _, k := range o.workers {
				p("| Nudge e2e, %d in-process workers + dispatcher | %s | %s |\n", k, thousands(o.nFor(k)), fmtSf(pick(r.e2e[k], func(x e2eResult) float64 { return x.RSS })))
				p("| River, default fetch settings, %d clients | %s | %s |\n", k, thousands(o.nFor(k)), fmtSf(pick(r.river[k], func(x riverResult) float64 { return x.RSS })))
				p("| River tuned as `river bench`, %d clients | %s | %s |\n", k, thousands(o.nFor(k)), fmtSf(pick(r.tuned[k], func(x riverResult) float64 { return x.RSS })))
			}
		}
		p("\n")
	}
	if r.profiled != "" {
		p("## Profile\n\nA CPU profile of the first end-to-end run with %d workers is written to `bench/%s` (`go tool pprof -top bench/%s`).\n\n", o.profileWorkers, r.profiled, r.profiled)
	}
	p("## Not measured yet\n\n")
	if o.nOther < o.n {
		p("- N = %s for every configuration, not only the headline (`make bench BENCH_N_OTHER=%d`, well over 15 minutes).\n", thousands(o.n), o.n)
	}
	p("- Latency with the workers as separate processes (the latency runs host them in the harness), and several worker processes at once.\n")
	p("- The scale tables in the due-ordered store's steady state: `reminder_state` also holding a retention window's terminal rows (the promoted ids then land on random leaves of its primary key); the promoter under a long web transaction (re-scans); the full layout (every state row at intake), measured until 2026-12-02.\n")
	p("\n`cd bench && go run ./cmd/nudge-bench -diagnose` runs EXPLAIN (ANALYZE, BUFFERS, WAL) on the dispatcher's statements over N due reminders and samples `pg_stat_activity` every 5 ms during one end-to-end run: where PostgreSQL spends its time, by statement and wait event. `-only scale` (or `latency`, `procs`, …) runs one section and writes its report to `bench/out/benchmarks-only.md` (not here, unless `-out` says so); `-h` lists the sizes.\n")
	// Hand-written notes below the marker survive a regeneration.
	p("\n%s\n", notesMarker)
	if old, err := os.ReadFile(o.out); err == nil {
		if _, tail, ok := strings.Cut(string(old), notesMarker+"\n"); ok {
			b.WriteString(tail)
		}
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	if err := os.WriteFile(o.out, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

// latencyLoadShare is the share of the headline throughput the latency runs
// offered (-latency-load, or 0 when -latency-rate fixed the rate).
func (o options) latencyLoadShare() float64 {
	if o.latencyRate > 0 {
		return 0
	}
	return o.latencyLoad
}

func reportLatency(p func(string, ...any), o options, r results) {
	offered := pick(r.latency, func(x latencyResult) float64 { return x.Offered })
	achieved := pick(r.latency, func(x latencyResult) float64 { return x.Achieved })
	n := pick(r.latency, func(x latencyResult) float64 { return float64(x.N) })
	p("A stream of SMS reminders scheduled through the intake beforehand and **due one after the other at a steady rate** of %s reminders/s (median over runs; ", fmtR(offered, 0))
	if o.latencyRate > 0 {
		p("set with `-latency-rate`")
	} else {
		p("%.0f%% of the median %d-worker end-to-end throughput measured so far in this run", 100*o.latencyLoad, o.headline)
	}
	p(") for %s (%.0f reminders a run), delivered by %d in-process workers (default configuration) and an in-process dispatcher in its loop (`Dispatcher.Loop`, batch 500), to the instant fake SMS provider. The loop starts a pass as soon as the next pending reminder is due (the earliest `due_at` after the last pass's cutoff, one probe of `reminder_state_pending_due` after each pass), at once when a pass left due rows behind, but never sooner than the minimum gap (`--min-gap`: %s) nor later than %s (`--every`, `-latency-every`) after the last pass started: a steady stream is claimed a pass every minimum gap. Delivered rate, first due → last terminal: %s reminders/s. Every reminder delivered in every run: %s.\n\n",
		o.latencyFor, n.Median, o.headline, minGapText(), o.latencyEvery, fmtR(achieved, 0), yes(allStreamDelivered(r)))
	if latencyWarmup > 0 {
		p("**Warm start** (`-latency-warmup %s`): the stream begins %s earlier, at the same rate, and the reminders due in that lead are worked by the same dispatcher and workers but left out of every figure below (hops, histograms, rates, CPU, load): the measurement starts when the first measured reminder is due, in the middle of a stream already flowing. The dispatcher and workers start afresh in each run (new broker connections, the dispatcher's pool, the statements' first plans, the fake provider's connections not yet dialled; the workers open their database connections before they are ready): on 2026-12-03, before the workers did, their first batches took 170–290 ms to send, whose backlog took as long again to drain, over 1%% of a run, so a cold start alone set the p99 (~200 ms at 4,600/s against 8 ms at the median; 43–60 ms since the workers warm their connections). A deployed worker's p99 is that of a process up for hours; `-latency-warmup 0` measures the cold start.\n\n",
			latencyWarmup, latencyWarmup)
	}
	passes := pick(r.latency, func(x latencyResult) float64 {
		return float64(x.Passes) / x.LastTerminal.Sub(x.FirstDue).Seconds()
	})
	per1k := func(f func(cpuTicks) float64) stats {
		return pick(r.latency, func(x latencyResult) float64 { return 1000 * f(x.CPU) / float64(max(x.Delivered, 1)) })
	}
	pg, mq, h := per1k(func(c cpuTicks) float64 { return c.Postgres }), per1k(func(c cpuTicks) float64 { return c.RabbitMQ }),
		per1k(func(c cpuTicks) float64 { return c.Harness })
	all := per1k(func(c cpuTicks) float64 { return c.Postgres + c.RabbitMQ + c.Harness + c.Provider })
	p("**What the passes cost** (median over runs, range): the dispatcher ran %s passes a second (first due → last terminal); CPU-s per 1,000 delivered reminders, from `/proc` between the move of the stream and the last terminal state: PostgreSQL %.3f (%.3f–%.3f), RabbitMQ %.3f (%.3f–%.3f), the harness (dispatcher and workers) %.3f (%.3f–%.3f), all with the fake provider %.3f (%.3f–%.3f).\n\n",
		fmtR(passes, 0), pg.Median, pg.Min, pg.Max, mq.Median, mq.Min, mq.Max, h.Median, h.Min, h.Max, all.Median, all.Min, all.Max)
	p("From the event trail (`reminder_timeline`: the events stored in `reminder_events` and those folded into the reminder row), per reminder: **due→claim** = the claim event (`pending → enqueued`) − `due_at` (mostly the dispatcher's interval: a row waits for the next pass); **claim→enqueue** = the batch's publish confirmation (`publish_confirms.confirmed_at`: the dispatcher's clock once the broker confirmed the whole batch, before it records it) − the claim (sign, publish with confirms, the batch's confirms); **enqueue→start** = `sending` − the confirmation (broker delivery, the worker's batch wait of 10 ms, reading the row, claiming the attempt); **start→terminal** = terminal event − `sending` (render, the HTTP send, until the outcome is about to be written: the worker's clock before its write commits). **Enqueue→terminal** (the target) and **end to end** (terminal − `due_at`) span several hops. A change to how a pass claims and publishes moves the claim and confirmation times themselves (a pass claiming in several statements claims and confirms its later rows later, so their enqueue→terminal shrinks whether or not they end sooner): judge such a change on end to end, whose start, the due time, it cannot move. Each cell is the median over runs of that run's percentile, with the range over runs.\n\n")
	overtaken := pick(r.latency, func(x latencyResult) float64 { return 100 * ratio(float64(x.Overtaken), float64(x.N)) })
	noEnq := pick(r.latency, func(x latencyResult) float64 { return 100 * ratio(float64(x.NoEnqueue), float64(x.N)) })
	p("**%.1f%% of the reminders were started by their worker before their batch's confirmation was recorded** (median over runs; %.1f–%.1f%%): the confirmation time is the moment the broker had confirmed the *whole* batch, and a worker may claim a message it already holds (the message proves the publish), so their enqueue→start is below zero (\"below zero\" column) and their enqueue→terminal counts from the batch's confirmation rather than from the moment their own message reached the queue, which was earlier. %.1f%% (%.1f–%.1f%%) have no confirmation recorded (their dispatcher pass failed): no enqueue time, left out of the hops that start or end there.\n\n",
		overtaken.Median, overtaken.Min, overtaken.Max, noEnq.Median, noEnq.Min, noEnq.Max)
	pressure := pick(r.latency, func(x latencyResult) float64 { return 100 * x.Machine.Pressure })
	delay := pick(r.latency, func(x latencyResult) float64 { return float64(x.Machine.RunDelay) / float64(time.Millisecond) })
	load := pick(r.latency, func(x latencyResult) float64 { return x.Machine.Load })
	if pressure.Min >= 0 {
		p("**How busy the machine was** during the runs (median over runs, range): some runnable task waited for a CPU during %.0f%% (%.0f–%.0f%%) of the run's wall time (`/proc/pressure/cpu`, \"some\"); the harness's threads, which host the dispatcher and the workers (the fake provider is a process of its own), waited runnable for a CPU %s ms per second of the run (`/proc/self/task/*/schedstat`); load average %s at the runs' end. On an idle machine both are near zero: what the harness's threads wait for a CPU is added to the hops above, whatever the code does.\n\n",
			pressure.Median, pressure.Min, pressure.Max, fmtR(delay, 0), fmtR(load, 1))
	}
	p("%s\n\n", checkpointsNote(r.latency, latencyCheckpoint))
	p("%s\n", failedPassesNote(func(yield func([]string) bool) {
		for _, x := range r.latency {
			if !yield(x.FailedPasses) {
				return
			}
		}
	}, "latency"))
	p("| hop | p50 ms | p90 ms | p99 ms | max ms | below zero |\n|---|---|---|---|---|---|\n")
	for _, hop := range latencyHops {
		p50 := pick(r.latency, func(x latencyResult) float64 { return x.Hops[hop].P50 })
		p90 := pick(r.latency, func(x latencyResult) float64 { return x.Hops[hop].P90 })
		p99 := pick(r.latency, func(x latencyResult) float64 { return x.Hops[hop].P99 })
		mx := pick(r.latency, func(x latencyResult) float64 { return x.Hops[hop].Max })
		neg := pick(r.latency, func(x latencyResult) float64 {
			h := x.Hops[hop]
			return 100 * ratio(float64(h.Negative), float64(h.Count))
		})
		name := strings.ReplaceAll(hop, "_", " ")
		if hop == hopEnqueueToTerminal {
			name = "**" + name + "** (target)"
		}
		p("| %s | %s | %s | %s | %s | %.1f%% |\n", name, fmtR(p50, 1), fmtR(p90, 1), fmtR(p99, 1), fmtR(mx, 1), neg.Median)
	}
	p("\n")
	p("The same hops from the histograms the dispatcher and the workers recorded (`nudge_hop_latency_seconds`): the processes' own view, the one Prometheus alerts on. Its buckets (10 ms, 50 ms, 100 ms, 250 ms, …) only say which bucket a quantile falls in (median over runs); the share at or under 50 ms is exact, 50 ms being a bound. The worker's enqueue→start starts at the envelope's `FirstSeen` (when the dispatcher sealed the message, before publishing), not at the confirm, so it includes the publish and is never negative; the dispatcher observes claim→enqueue for every message the broker confirmed, at the moment it records the batch's confirmation.\n\n")
	p("| hop (histogram) | samples per run | p50 in bucket | p99 in bucket | ≤ 50 ms median | min | max |\n|---|---|---|---|---|---|---|\n")
	for _, hop := range []string{metrics.HopDueToClaim, metrics.HopClaimToEnqueue, metrics.HopEnqueueToStart, metrics.HopStartToTerminal} {
		cnt := pick(r.latency, func(x latencyResult) float64 { return float64(x.Hist[hop].Count) })
		p50 := pick(r.latency, func(x latencyResult) float64 { return x.Hist[hop].P50 })
		p99 := pick(r.latency, func(x latencyResult) float64 { return x.Hist[hop].P99 })
		under := pick(r.latency, func(x latencyResult) float64 { return 100 * x.Hist[hop].Under50ms })
		p("| %s | %.0f | %s | %s | %.1f%% | %.1f%% | %.1f%% |\n", strings.ReplaceAll(hop, "_", " "), cnt.Median,
			bucketLabel(p50.Median), bucketLabel(p99.Median), under.Median, under.Min, under.Max)
	}
	p("\n")
}

// bucketLabel names the latency bucket whose upper bound is ub (seconds).
func bucketLabel(ub float64) string {
	ms := func(s float64) string { return strconv.FormatFloat(s*1000, 'f', -1, 64) }
	lower := 0.0
	for _, b := range metrics.LatencyBuckets {
		if b >= ub {
			break
		}
		lower = b
	}
	if math.IsInf(ub, 1) {
		return "> " + ms(lower) + " ms"
	}
	return ms(lower) + "–" + ms(ub) + " ms"
}

func reportScale(p func(string, ...any), o options, m machine, r results) {
	ctl := rowsLabel(r.scale[0].ControlSize)
	p("The dispatcher's claim (`store.ClaimDue`, the statement `Dispatcher.RunOnce` runs, batch %d, one transaction per batch) against tables of different sizes, each a schema of its own migrated with the real migrations, filled with `INSERT … SELECT generate_series` and dropped before the next is built. ", o.batch)
	p("Beside each lives a fresh **control** table of %s rows built the same way, and the claims alternate between the two batch by batch (control, table, table, control, …), so each size is compared with claims taken within milliseconds of its own on a machine whose load moves all the time; a run's rate is its rows over its own statements' time, and the ratio is the table's median over its control's.\n\n", ctl)
	p("**The layout is the due-ordered store's, as production holds it once lazy intake is on** (schema 44, after the rollout; every schema the harness migrates runs with lazy intake on, a horizon of 2 hours, and without `reminder_state`'s foreign key): every reminder is lazy (`reminders.lazy`, in the partial index `reminders_due_order`) and none has a `reminder_state` row when the table is built. ")
	p("A table's size counts the rows the claim should not care about: every one scheduled for later, over the 30 days after tomorrow (no state row, so in no index of `reminder_state` at all), channels alternating, for 16 tenants (id mod 16): the table of section 4b, which shares it. **On top of them** every table holds the same two sets of %d × %s reminders due before the cutoff, so the claims do the same work whatever the size: **clustered**, a block of consecutive ids (as rows scheduled together are stored together), and **spread**, evenly over the whole id range (as reminders scheduled on different days for the same hour are; `shared_buffers` %s here). ",
		o.runs, thousands(o.scalePerRun), m.SharedBuffers)
	p("Their state rows are inserted by the **promoter** (`store.Promote`, the dispatcher's pass: up to the database's clock plus H = %g h, %s reminders a pass, in (due_at, id) order), timed, before the scrapes and the claims, as a dispatcher whose last pass ran before the reminders were written runs it: passes until its sweep completes, then a second sweep that scans the range again and moves the final watermark past the due sets, where a running dispatcher leaves it (so 4b's read of `nudge_unpromoted_due` reads the range a caught-up promoter leaves). Passes alternate between the table and its control. ", promoteAhead.Hours(), thousands(promoteLimit))
	p("Unique constraints and secondary indexes are built after the load (as a restore would; the partial indexes that the first chunk of rows leaves empty are built on it and kept during the rest of the load), then the table is vacuumed and analyzed (as autovacuum does after a bulk insert: the promoter's scan is index-only) and a checkpoint taken; `reminder_state` is analyzed after the promotion; autovacuum is off for both tables so that a vacuum of gigabytes cannot start during the claims. ")
	p("Each run claims %s rows from each table in batches of %d, with the cutoff at build time: runs 1–%d take the clustered set (due first), runs %d–%d the spread one (the batch at the boundary may mix them), and each starts where the previous one stopped (its index walk passes the entries the previous claims left dead until a vacuum, as the dispatcher's does). The tables hold no event history (`reminder_events` gets only the claims' own events): the claim only appends to it. ",
		thousands(o.scalePerRun), o.batch, o.runs, o.runs+1, 2*o.runs)
	p("**Promote+claim** counts the promotion as the claim's work: a run's rows over its claims' time plus its rows' share of the promoter's time for that set (both sweeps; each pass's time split by the rows it read of each set).\n\n")
	p("| size (rows besides the due ones) | due rows | table + indexes | loaded + indexed in | claimed rows/s median | min | max | ms per claim, p50 | p99 | control (%s) rows/s median | table / control | promote+claim rows/s median | control | table / control |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", ctl)
	for _, lay := range []string{"clustered", "spread"} {
		for _, s := range r.scale {
			l, c := s.Clustered, s.ControlClustered
			if lay == "spread" {
				l, c = s.Spread, s.ControlSpread
			}
			rates, crates := summarize(l.Rates), summarize(c.Rates)
			pc, cpc := summarize(l.promoteClaimRates()).Median, summarize(c.promoteClaimRates()).Median
			p("| %s | %s | %s | %s + %s | %s | %.1f | %.1f | %.0f | %.2f | %.0f | %.0f | %.2f |\n", thousands(s.Size), lay, byteSize(s.TotalBytes),
				s.Load.Round(time.Second), s.Index.Round(time.Second), fmtS(rates),
				percentile(l.BatchMs, 0.5), percentile(l.BatchMs, 0.99), crates.Median, ratio(rates.Median, crates.Median),
				pc, cpc, ratio(pc, cpc))
		}
	}
	p("\nThe promotion of each set (one measurement per table: the passes before the runs), on the table and on its control: the state rows inserted per second of the first sweep's passes, and the backend's CPU per row (`/proc/<pid>/schedstat` of the one connection the passes use); the re-scan is the second sweep's passes, counted in promote+claim (until schema 46 they re-read the same reminders, each a primary-key probe; since, the second sweep starts where the first ended, as no writer was in flight, and reads nothing).\n\n")
	p("| size | due rows | state rows inserted | promotion rows/s | control | CPU µs per row | control | re-scan ms | control |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, lay := range []string{"clustered", "spread"} {
		for _, s := range r.scale {
			l, c := s.Clustered.Promoted, s.ControlClustered.Promoted
			if lay == "spread" {
				l, c = s.Spread.Promoted, s.ControlSpread.Promoted
			}
			p("| %s | %s | %s | %.0f | %.0f | %s | %s | %.0f | %.0f |\n", thousands(s.Size), lay, thousands(int(l.Rows)),
				perSec(l.Rows, l.FirstSec), perSec(c.Rows, c.FirstSec), cpuPerRow(l), cpuPerRow(c), 1000*l.RescanSec, 1000*c.RescanSec)
		}
	}
	p("\nWhat the planner makes of the claim on each table (`EXPLAIN (FORMAT JSON)` of the statement in `internal/store/queries.sql`, with a batch of %d, before the runs, after the promotion): its cost estimate, and whether PostgreSQL JIT-compiles it — which it does on every execution once the estimate passes `jit_above_cost` (%s).\n\n", o.batch, m.JIT)
	p("| size | claim's cost estimate | JIT | control's estimate | control JIT |\n|---|---|---|---|---|\n")
	for _, s := range r.scale {
		p("| %s | %.0f | %s | %.0f | %s |\n", thousands(s.Size), s.Plan.Cost, jitLabel(s.Plan), s.ControlPlan.Cost, jitLabel(s.ControlPlan))
	}
	p("\n")
}

func perSec(n int64, sec float64) float64 {
	if sec <= 0 {
		return 0
	}
	return float64(n) / sec
}

// cpuPerRow is the first sweep's backend CPU per state row inserted, µs.
func cpuPerRow(s promoterShare) string {
	if !s.CPUKnown || s.Rows == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", 1e6*s.FirstCPU/float64(s.Rows))
}

func jitLabel(c claimPlan) string {
	switch {
	case !c.JIT:
		return "no"
	case c.Inline && c.Optimize:
		return "**yes**, inlined and optimized"
	case c.Optimize:
		return "**yes**, optimized"
	case c.Inline:
		return "**yes**, inlined"
	}
	return "**yes**"
}

func reportProcs(p func(string, ...any), o options, r results) {
	rate := pick(r.procs, func(x procResult) float64 { return x.Rate })
	p("The real binaries, built from this tree with `go build` into a temporary directory, each a process of its own: one `sms-worker` (`--prefetch %d`, otherwise its defaults: concurrency 4, batch 50), started first and ready, then one `dispatcher` (`--batch %d`, in its loop, its first pass taking the whole backlog of %s due reminders). The fake SMS provider runs in a process of its own (this binary, `-serve-fake-provider`), as in the end-to-end runs. Peak RSS is `VmHWM` from `/proc/<pid>/status`, read just before SIGTERM (the dispatcher once every reminder is enqueued, the worker once every one is terminal); not `ru_maxrss`, which for a child of a Go process starts at the parent's RSS (the kernel carries the high-water mark of the memory shared until `execve` into the child). CPU is the process's user + system time over its whole life, per 1,000 reminders. This setup delivered %s reminders/s (first claim → last terminal).\n\n",
		o.procPrefetch, o.batch, thousands(o.procN), fmtR(rate, 0))
	p("| process | peak RSS (VmHWM) MiB median | min | max | CPU s per 1,000 reminders |\n|---|---|---|---|---|\n")
	f := 1000 / float64(o.procN)
	p("| sms-worker, prefetch %d | %s | %.3f |\n", o.procPrefetch,
		fmtSf(pick(r.procs, func(x procResult) float64 { return x.WorkerMiB })),
		pick(r.procs, func(x procResult) float64 { return x.WorkerCPU * f }).Median)
	p("| dispatcher, batch %d | %s | %.3f |\n\n", o.batch,
		fmtSf(pick(r.procs, func(x procResult) float64 { return x.DispatcherMiB })),
		pick(r.procs, func(x procResult) float64 { return x.DispatcherCPU * f }).Median)
	var werr, derr []string
	for _, x := range r.procs {
		werr, derr = append(werr, x.WorkerErrors...), append(derr, x.DispatcherErrors...)
	}
	if len(werr)+len(derr) == 0 {
		p("Neither process logged an error in any run.\n\n")
	} else {
		p("**Errors logged** over the runs: sms-worker %d, dispatcher %d (the dispatcher's loop runs a failed pass again a second later). The first:\n\n", len(werr), len(derr))
		for _, l := range append(firstN(werr, 1), firstN(derr, 1)...) {
			p("    %s\n", truncate(l, 400))
		}
		p("\n")
	}
}

func byteSize(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.0f KiB", float64(b)/(1<<10))
}

// percentile is the nearest-rank percentile of xs.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

const riverVersion = "v0.51.2"

// notesMarker starts the hand-written part of the report, kept as is.
const notesMarker = "<!-- Hand-written notes below this line are kept by nudge-bench. -->"

func allDelivered(o options, r results) bool {
	for k, rs := range r.e2e {
		for _, x := range rs {
			if x.Delivered != o.nFor(k) {
				return false
			}
		}
	}
	return true
}

func allStreamDelivered(r results) bool {
	for _, x := range r.latency {
		if x.Delivered != x.N {
			return false
		}
	}
	return true
}

// failedPassesNote says how many dispatcher passes failed over a section's
// runs (each was run again, as the dispatcher's loop would), with the first
// error.
func failedPassesNote(all func(yield func([]string) bool), section string) string {
	var n int
	var first string
	for fs := range all {
		n += len(fs)
		if first == "" && len(fs) > 0 {
			first = fs[0]
		}
	}
	if n == 0 {
		return fmt.Sprintf("No dispatcher pass failed in the %s runs.\n", section)
	}
	return fmt.Sprintf("**%d dispatcher pass(es) failed** in the %s runs and were run again (as the dispatcher's loop would at its next tick); the first: `%s`.\n", n, section, truncate(first, 300))
}

func firstN(xs []string, n int) []string { return xs[:min(n, len(xs))] }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func reportScrape(p func(string, ...any), o options, r results) {
	ctl := rowsLabel(o.controlSize)
	p("The reconciler's two periodic costs against tables of reminders **scheduled for later** (issue 18: a SaaS that schedules months ahead holds tens of millions), measured on section 4's tables after the promotion and before their claims (the two sections share every table: built once, measured for both, dropped once): every reminder besides section 4's due sets is due over the 30 days after tomorrow, lazy, without a state row, and the due sets' state rows are the promoter's, with its final watermark where a caught-up dispatcher leaves it (section 4), so the scrape's read of the reminders due without a state row (`nudge_unpromoted_due`) is the empty range it reads in production. ")
	p("Both sections' due sets are in every table, so the scrape's clock (the collector's and the pass's `now`) is set to the moment the first %s rows of the clustered set are due and no other: a backlog of %s due rows, the same at every size, and nothing in flight or owed. ", thousands(scrapeBacklog), thousands(scrapeBacklog))
	p("A **scrape** is one `Gather` of a registry holding only the DB collector (`internal/metrics`, one statement); a **pass** is the three statements of a reconciler pass that finds nothing owed (`ExpireOverdue`, `ResolveExpiredLeases`, `Reclaim`; the broker's part of a pass does not read the table). ")
	p("%d of each on the table and on its %s control, alternating table by table (control, table, table, control, …) after %d untimed ones on each, so both are warmed alike and see the same moments of the machine; the ratio is the table's median over its control's. For contrast, the last column is what the scrape's count of open reminders cost before migration 0023 (every open row by channel and state, those scheduled for later included, in this layout the state rows and the lazy reminders without one; 3 runs): what a scrape paid per reminder scheduled.\n\n", scrapeTimes, ctl, scrapeWarmup)
	p("| scheduled rows | table + indexes | scrape ms median | min | max | control (%s) median | table / control | pass ms median | min | max | control median | table / control | count of every open row (before 0023), ms median |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", ctl)
	for _, s := range r.scrape {
		sc, sctl := summarize(s.ScrapeMs), summarize(s.CtlScrapeMs)
		ps, pctl := summarize(s.PassMs), summarize(s.CtlPassMs)
		p("| %s | %s | %s | %.1f | %.2f | %s | %.1f | %.2f | %.1f |\n", thousands(s.Size), byteSize(s.TotalBytes),
			fmtSf(sc), sctl.Median, ratio(sc.Median, sctl.Median), fmtSf(ps), pctl.Median, ratio(ps.Median, pctl.Median),
			summarize(s.CountMs).Median)
	}
	p("\nWhat each statement cost the server, from `EXPLAIN (ANALYZE, BUFFERS)` once on each table after the timed runs (in a transaction rolled back): shared buffers the planner and the execution touched (hit + read; these do not depend on the machine's load), and planning and execution time (which do).\n\n")
	p("| scheduled rows | statement | planning buffers | control | execution buffers | control | planning ms | control | execution ms | control |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range r.scrape {
		for i, pl := range s.Plans {
			c := s.CtlPlans[i]
			p("| %s | %s | %d | %d | %d | %d | %.2f | %.2f | %.2f | %.2f |\n", thousands(s.Size), pl.Name,
				pl.PlanHit+pl.PlanRead, c.PlanHit+c.PlanRead, pl.Hit+pl.Read, c.Hit+c.Read,
				pl.PlanningMs, c.PlanningMs, pl.ExecutionMs, c.ExecutionMs)
		}
	}
	p("\nThe plans themselves are written to `bench/out/scrape-plans-SIZE.txt`.\n\n")
}

// runCost is what one run spent: CPU by owner and WAL.
type runCost struct {
	CPU cpuTicks
	WAL walUsage
}

// costSummary is the median cost of a configuration's runs: CPU-seconds per
// 1,000 items by process, and WAL per item.
type costSummary struct {
	Postgres, RabbitMQ, Harness, Provider, Other float64
	// PGBackends is the part of Postgres its client backends used (the
	// statements), the rest being autovacuum and the server's own processes.
	PGBackends           float64
	ClusterBytes         float64 // every byte the cluster wrote, per item
	Records, RecordBytes float64 // the run's own relations, per item
	HasRecords           bool    // counted in the first run only
}

// Total is Nudge's (or River's) own: PostgreSQL, RabbitMQ and the harness
// process, without the fake provider's process (the server side of the HTTP
// call, the provider's machine in production).
func (c costSummary) Total() float64 { return c.Postgres + c.RabbitMQ + c.Harness }

// AllIn is Total with the fake provider's process: the figure reports before
// the provider had a process of its own gave as "total".
func (c costSummary) AllIn() float64 { return c.Total() + c.Provider }

func summarizeCosts(runs []runCost, n int) costSummary {
	f, per := 1000/float64(n), 1/float64(n)
	var pg, be, mq, h, pr, ot, wb, wr, wrb []float64
	for _, x := range runs {
		c := x.CPU
		pg, mq, h, pr, ot = append(pg, c.Postgres*f), append(mq, c.RabbitMQ*f), append(h, c.Harness*f), append(pr, c.Provider*f), append(ot, c.Other*f)
		be = append(be, c.PGBackends*f)
		wb = append(wb, x.WAL.Bytes*per)
		if x.WAL.Records >= 0 { // counted in the first run only
			wr, wrb = append(wr, x.WAL.Records*per), append(wrb, x.WAL.RecordBytes*per)
		}
	}
	out := costSummary{Postgres: summarize(pg).Median, RabbitMQ: summarize(mq).Median, Harness: summarize(h).Median,
		Provider: summarize(pr).Median, Other: summarize(ot).Median, ClusterBytes: summarize(wb).Median,
		PGBackends: summarize(be).Median}
	if len(wr) > 0 {
		out.Records, out.RecordBytes, out.HasRecords = summarize(wr).Median, summarize(wrb).Median, true
	}
	return out
}

// pairedRatios is num's i-th value over den's i-th, run by run, as "a, b,
// c" (runs that lack either are left out).
func pairedRatios[N, D any](num []N, den []D, nv func(N) float64, dv func(D) float64) string {
	var out []string
	for i := range min(len(num), len(den)) {
		out = append(out, fmt.Sprintf("%.2f", ratio(nv(num[i]), dv(den[i]))))
	}
	return strings.Join(out, ", ")
}

func nudgeCosts(es []e2eResult) []runCost {
	out := make([]runCost, 0, len(es))
	for _, x := range es {
		out = append(out, runCost{x.CPU, x.WAL})
	}
	return out
}

func riverCosts(rs []riverResult) []runCost {
	out := make([]runCost, 0, len(rs))
	for _, x := range rs {
		out = append(out, runCost{x.CPU, x.WAL})
	}
	return out
}

func reportBurst(p func(string, ...any), o options, r results) {
	p("%s SMS reminders seeded through the intake an hour ahead (within lazy intake's 2-hour horizon, so each gets its state row at intake, which the move moves), then moved to be due in the **same second** (a class reminded at 9:00), with %d in-process workers and the dispatcher in its loop (passes at most %s apart), as in section 3. Due → last terminal is from that second to the last reminder's `finished_at`; CPU and WAL are counted from the move until every reminder is terminal, as in section 1.\n\n",
		thousands(o.nOther), o.headline, o.latencyEvery)
	p("| N | due → last terminal, s median | min | max | delivered per second | CPU s per 1,000: PostgreSQL | RabbitMQ | harness | WAL records per item | their bytes per item |\n|---|---|---|---|---|---|---|---|---|---|\n")
	span := pick(r.burst, func(x latencyResult) float64 { return x.LastTerminal.Sub(x.FirstDue).Seconds() })
	f := 1000 / float64(o.nOther)
	recs, recBytes := "–", "–"
	if w := r.burst[0].WAL; w.Records >= 0 { // counted in the first run only
		recs, recBytes = fmt.Sprintf("%.1f", w.Records/float64(o.nOther)), fmt.Sprintf("%.0f", w.RecordBytes/float64(o.nOther))
	}
	p("| %s | %s | %.0f | %.3f | %.3f | %.3f | %s | %s |\n", thousands(o.nOther), fmtSf(span),
		pick(r.burst, func(x latencyResult) float64 { return x.Achieved }).Median,
		pick(r.burst, func(x latencyResult) float64 { return x.CPU.Postgres * f }).Median,
		pick(r.burst, func(x latencyResult) float64 { return x.CPU.RabbitMQ * f }).Median,
		pick(r.burst, func(x latencyResult) float64 { return x.CPU.Harness * f }).Median, recs, recBytes)
	p("\n")
}

func reportPlanning(p func(string, ...any), r results) {
	n := r.planning[0].N
	p("The same %s reminder intents (email, due in an hour, a template and a data object each) written three ways, each into a schema of its own (issue 15): a **campaign** planned by **one planner** (`internal/campaign`, in the harness) consuming its own chain of signed planning commands through RabbitMQ, in slices of %d audience rows read from a table by keyset (each slice one transaction: the campaign's row lock, the read, the bulk intake statement, the checkpoint; then the confirmed continuation); **`nudgectl schedule -f`**, the real binary, of a JSON Lines file of the same reminders (its process start included); and the SQL function **`nudge_schedule`**, one call and one transaction per reminder over one connection, as a web tier scheduling as it goes. ", thousands(n), planningSliceSize)
	p("The planner's rate is N over publishing the first command → the campaign's `ended_at`; slice time is the mean of `nudge_campaign_slice_duration_seconds` (transaction and continuation confirm), cycle the median time from one slice's start to the next's (the queue hop included). More planners plan more campaigns at once, not one faster: a campaign's slices are sequential.\n\n")
	p("| way | N | intents/s median | min | max |\n|---|---|---|---|---|\n")
	p("| campaign, one planner, slices of %d | %s | %s |\n", planningSliceSize, thousands(n), fmtS(pick(r.planning, func(x planningResult) float64 { return x.PlannerRate })))
	p("| `nudgectl schedule -f` | %s | %s |\n", thousands(n), fmtS(pick(r.planning, func(x planningResult) float64 { return x.FileRate })))
	p("| `nudge_schedule`, one call per reminder | %s | %s |\n\n", thousands(n), fmtS(pick(r.planning, func(x planningResult) float64 { return x.SQLRate })))
	p("| planner | median | min | max |\n|---|---|---|---|\n")
	p("| slice time, ms (mean per run) | %s |\n", fmtSf(pick(r.planning, func(x planningResult) float64 { return x.SliceMs })))
	p("| slice cycle, ms (median per run) | %s |\n", fmtSf(pick(r.planning, func(x planningResult) float64 { return x.CycleMs })))
	p("| slices per run | %s |\n\n", fmtS(pick(r.planning, func(x planningResult) float64 { return float64(x.Slices) })))
	p("**PostgreSQL's CPU per intent** (issue 18's function path): the same intents written again, each way into a schema of its own over one connection, in statements of %s rows: `nudge_schedule` once per row (`SELECT count(nudge_schedule(…)) FROM unnest(…)`, as an import written in SQL calls it), the bulk statement (`intake.ScheduleMany`) and the same statement called from SQL as `nudge_schedule_many` (schema 50: one call per 1,000 rows, the rows as arrays); beside them the one-call-per-transaction run above. The backend's CPU from `/proc/<pid>/schedstat` (nanoseconds) over the writes, after one intent that warms its caches and plans; each call of the function runs its own INSERT statements (the wide row, the state row, the event), so it pays per intent what the bulk statement pays per %s: the executor's start on three tables and their indexes, and their CHECK constraints read back from their stored text and prepared.\n\n",
		thousands(intakeCPUStatement), thousands(intakeCPUStatement))
	p("| backend CPU-s per 1,000 intents | median | min | max |\n|---|---|---|---|\n")
	p("| bulk statement, %s rows each | %s |\n", thousands(intakeCPUStatement), fmtSf3(pick(r.planning, func(x planningResult) float64 { return x.BulkCPU })))
	p("| `nudge_schedule_many` (schema 50), %s rows a call | %s |\n", thousands(intakeCPUStatement), fmtSf3(pick(r.planning, func(x planningResult) float64 { return x.ManyCPU })))
	p("| `nudge_schedule` once per row, %s rows a statement | %s |\n", thousands(intakeCPUStatement), fmtSf3(pick(r.planning, func(x planningResult) float64 { return x.FnRowsCPU })))
	p("| `nudge_schedule`, one call per transaction | %s |\n", fmtSf3(pick(r.planning, func(x planningResult) float64 { return x.SQLCPU })))
	p("| `nudge_schedule_many` / bulk | %s |\n", fmtSf2(pick(r.planning, func(x planningResult) float64 { return ratio(x.ManyCPU, x.BulkCPU) })))
	p("| function once per row / bulk (≤ 1.5) | %s |\n\n", fmtSf2(pick(r.planning, func(x planningResult) float64 { return ratio(x.FnRowsCPU, x.BulkCPU) })))
}

// reportStorage prints storage per reminder at each age: each stage's bytes
// less the last stage's (every reminder and event gone: what the empty
// tables and their indexes occupy whatever the count), over the reminders.
func reportStorage(p func(string, ...any), st storageResult) {
	p("After the first headline run (%s SMS reminders, all delivered), its schema compacted with `VACUUM FULL` and measured "+
		"(`pg_total_relation_size`: heap, TOAST and indexes), then the reconciler's retention pass (`internal/retention`, default windows) "+
		"run with its clock past each window until a pass finds nothing, and measured again. Bytes per reminder are a stage's size "+
		"less the last stage's (the empty tables and their indexes), over the reminders; the bench's payload (`data` and `recipient`) "+
		"is %.0f bytes a reminder as stored: a larger payload adds its own size until the payload window.\n\n", thousands(st.N), st.Payload)
	base := st.Stages[len(st.Stages)-1]
	per := func(stage storageStage, table string) float64 {
		return float64(stage.Bytes[table]-base.Bytes[table]) / float64(st.N)
	}
	var tables []string // those a reminder occupies a byte of at some age
	for _, t := range st.Tables {
		if slices.ContainsFunc(st.Stages, func(s storageStage) bool { return per(s, t) >= 1 }) {
			tables = append(tables, t)
		}
	}
	p("| age of the delivered reminders | bytes per reminder | rows changed or removed by retention to get there |")
	for _, t := range tables {
		p(" %s |", t)
	}
	p("\n|---|---|---|")
	for range tables {
		p("---|")
	}
	p("\n")
	for _, stage := range st.Stages[:len(st.Stages)-1] {
		p("| %s | **%.0f** | %s |", stage.Age, float64(stage.Total-base.Total)/float64(st.N), thousands(int(stage.Removed)))
		for _, t := range tables {
			p(" %.0f |", per(stage, t))
		}
		p("\n")
	}
	p("\nThe empty tables and indexes left after the event window: %s (rows past every window removed: %s).\n\n",
		byteSize(base.Total), thousands(int(base.Removed)))
}

// minGapText names the latency runs' minimum gap between passes.
func minGapText() string {
	if latencyMinGap <= 0 {
		return "the product's default, " + dispatch.DefaultMinGap.String()
	}
	return latencyMinGap.String() + " (`-latency-min-gap`; the product's default is " + dispatch.DefaultMinGap.String() + ")"
}

// checkpointsNote says whether PostgreSQL started checkpoints during the
// latency runs' measurements, and whether each run began with one.
func checkpointsNote(runs []latencyResult, before bool) string {
	counts := make([]string, 0, len(runs))
	for _, x := range runs {
		if x.Checkpoints < 0 {
			return "Checkpoints during the measurement: not read (`pg_stat_bgwriter`)."
		}
		counts = append(counts, strconv.Itoa(x.Checkpoints))
	}
	lead := "No CHECKPOINT before the streams (`-latency-checkpoint=false`)"
	if before {
		lead = "Each run's stream starts after a `CHECKPOINT` (after its seeding; `-latency-checkpoint`): the seeding's and the earlier sections' WAL would otherwise start a checkpoint every half minute or so during `make bench`, one in the measured seconds, with its writes and the full-page images of the pages first written after it"
	}
	return fmt.Sprintf("%s. Checkpoints the server started during each run's measurement (`pg_stat_bgwriter`): %s.", lead, strings.Join(counts, ", "))
}
