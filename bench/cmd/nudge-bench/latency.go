package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
)

// The hops of a reminder's way as the latency run reports them: the four of
// nudge_hop_latency_seconds, then two spans over several hops.
const (
	hopEnqueueToTerminal = "enqueue_to_terminal"
	hopEndToEnd          = "end_to_end"
)

var latencyHops = []string{
	metrics.HopDueToClaim, metrics.HopClaimToEnqueue, metrics.HopEnqueueToStart, metrics.HopStartToTerminal,
	hopEnqueueToTerminal, hopEndToEnd,
}

// hopLatency is one hop over one run, from the event trail (ms).
type hopLatency struct {
	Count, Negative    int
	P50, P90, P99, Max float64
}

// hopHistogram is one hop over one run, from the histogram the processes
// export (nudge_hop_latency_seconds): the upper bound of the bucket each
// quantile falls in (seconds; +Inf past the last bound), and the share at
// or under 50 ms (a bucket bound, so exact).
type hopHistogram struct {
	Count     uint64
	P50, P99  float64
	Under50ms float64 // 0..1
}

// latencyResult is one run at a steady offered rate.
type latencyResult struct {
	Offered   float64 // reminders/s the stream became due at
	Achieved  float64 // delivered / (first due → last terminal)
	N         int
	Delivered int
	Hops      map[string]hopLatency
	Hist      map[string]hopHistogram
	// Overtaken reminders were started by their worker before their batch's
	// publish confirmation was recorded; NoEnqueue ones have no confirmation
	// recorded at all (see the Hops query).
	Overtaken, NoEnqueue int
	// FailedPasses are the errors of the dispatcher's passes that failed
	// (its loop runs the next one after its back-off); Passes is how many
	// passes its loop ran, from the move until every reminder was terminal.
	FailedPasses []string
	Passes       int
	// FirstDue and LastTerminal bound the run (reminders' due_at and
	// finished_at); CPU and WAL are what it spent from the moment the
	// stream was moved into place until every reminder was terminal.
	FirstDue, LastTerminal time.Time
	CPU                    cpuTicks
	WAL                    walUsage
	// Machine is how busy the machine was over the run (from the move of
	// the stream until every reminder was terminal).
	Machine machineLoad
	// Checkpoints is how many checkpoints PostgreSQL started during the
	// measurement (pg_stat_bgwriter; -1 when unreadable).
	Checkpoints int
}

// machineLoad says whether a run's latencies are the machine's: Pressure
// is the share of the run's wall time during which some runnable task
// waited for a CPU (PSI "some", -1 without PSI), RunDelay the time this
// process's threads (dispatcher, workers; the fake provider is a process
// of its own) waited runnable
// for a CPU, per second of the run, and Load the 1-minute load average at
// the run's end.
type machineLoad struct {
	Pressure float64
	RunDelay time.Duration
	Load     float64
}

type machineMark struct {
	at       time.Time
	pressure time.Duration
	psi      bool
	delay    time.Duration
}

func markMachine() machineMark {
	p, ok := cpuPressure()
	return machineMark{at: time.Now(), pressure: p, psi: ok, delay: runDelay()}
}

func (m machineMark) since() machineLoad {
	wall := time.Since(m.at)
	out := machineLoad{Pressure: -1, Load: loadAvg()}
	if p, ok := cpuPressure(); ok && m.psi && wall > 0 {
		out.Pressure = float64(p-m.pressure) / float64(wall)
	}
	if wall > 0 {
		out.RunDelay = time.Duration(float64(runDelay()-m.delay) / wall.Seconds())
	}
	return out
}

// latencyRun seeds rate×dur SMS reminders that become due one after the
// other at a steady rate, runs k in-process workers and an in-process
// dispatcher in its loop (a pass when rows are due, at most `every` apart),
// and once all are terminal
// reads each hop's latency from the event trail and from the hop histograms
// the dispatcher and workers recorded.
// latencyMinGap is -latency-min-gap: the loop's least gap between passes
// in the latency runs (0: the product's default).
var latencyMinGap time.Duration

// latencyCheckpoint is -latency-checkpoint: a CHECKPOINT before each
// latency or burst run's stream.
var latencyCheckpoint = true

// checkpointsStarted is how many checkpoints the server has started
// (timed and requested), -1 when it cannot be read.
func checkpointsStarted(ctx context.Context, pool *pgxpool.Pool) int {
	var n int
	if err := pool.QueryRow(ctx, "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter").Scan(&n); err != nil {
		return -1
	}
	return n
}

// latencyWarmup is -latency-warmup: how long the stream of a latency run
// runs at the same rate before the measured reminders become due. The
// dispatcher and workers start cold (new pools and broker connections,
// their statements not yet prepared, the fake provider's connections not
// yet dialled): their first hundreds of milliseconds are slow and the
// backlog they leave takes as long again to drain, which at N = 55,000
// is over 1% of a run's reminders, so a cold start alone set the p99. A
// deployed fleet's p99 is that of workers that have been up for hours, as
// the end-to-end section's warm-up also measures; the warm-up's reminders
// are left out of every figure (hops, histograms, rates, CPU, WAL, load).
var latencyWarmup time.Duration

func latencyRun(ctx context.Context, e *env, rate float64, dur time.Duration, k int, every time.Duration) (latencyResult, error) {
	res := latencyResult{Offered: rate, N: int(rate * dur.Seconds())}
	if res.N < 1 {
		return res, fmt.Errorf("latency run of %s at %.0f/s holds no reminder", dur, rate)
	}
	gap := time.Duration(float64(time.Second) / rate)
	return streamRun(ctx, e, res, int(latencyWarmup/gap), gap, dur+3*time.Minute, k, every)
}

// burstRun is the burst row: n reminders all due in the same second, with
// k workers and the dispatcher in its loop (passes at most `every` apart): the time
// from that second to the last terminal state is FirstDue → LastTerminal.
func burstRun(ctx context.Context, e *env, n, k int, every time.Duration) (latencyResult, error) {
	return streamRun(ctx, e, latencyResult{N: n}, 0, 0, 10*time.Minute, k, every)
}

// streamRun runs res.N reminders due one after the other, gap apart (0: all
// at once), as latencyRun describes, allowing them `limit` to become
// terminal.
//
// The first warm of them are a warm-up: due before the measured ones at the
// same gap, worked by the same dispatcher and workers, and left out of
// every figure: the measurement (CPU, WAL, load, the hop histograms) starts
// when the first measured reminder is due, and the event trail is read for
// the measured reminders only.
func streamRun(ctx context.Context, e *env, res latencyResult, warm int, gap, limit time.Duration, k int, every time.Duration) (latencyResult, error) {
	// Seed far ahead (the intake takes seconds), then move the stream to
	// start a moment after the workers and the dispatcher are up. Far, but
	// within lazy intake's horizon (2 hours, schema 44): ShiftDue moves
	// state rows, and a reminder due past the horizon gets none at intake
	// (the promoter would insert it, in the measured seconds).
	seeded := time.Now().Add(time.Hour)
	total := res.N + warm
	s, err := setupNudge(ctx, e, total, func(i int) (time.Time, time.Time) {
		due := seeded.Add(time.Duration(i) * gap)
		return due, due.Add(2 * time.Hour)
	})
	if err != nil {
		return res, err
	}
	defer s.cleanup()
	var lazy int
	if err := s.pool.QueryRow(ctx, stmt("LazySeeded")).Scan(&lazy); err != nil {
		return res, fmt.Errorf("counting lazy reminders: %w", err)
	}
	if lazy != 0 {
		return res, fmt.Errorf("%d of %d seeded reminders are lazy (no state row for ShiftDue to move): seed within lazy intake's horizon", lazy, total)
	}
	// The seeding wrote hundreds of MB of WAL, and make bench's earlier
	// sections more: the server would start a WAL-triggered checkpoint
	// every half minute, one of them in the measured seconds (a checkpoint's
	// writes and the full-page images of the pages first written after it).
	// One now (best effort: a superuser's or pg_checkpoint's) leaves the
	// measurement to the stream's own WAL, below max_wal_size.
	if latencyCheckpoint {
		if _, err := s.pool.Exec(ctx, "CHECKPOINT"); err != nil {
			fmt.Printf("  (no checkpoint before the stream: %v)\n", err)
		}
	}
	keys, err := message.ParseKeys(signingKeys)
	if err != nil {
		return res, err
	}
	var sent atomic.Int64
	sender, closeSink, err := fakeSMS(&sent)
	if err != nil {
		return res, err
	}
	defer closeSink()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	stopWorkers, err := s.startWorkers(ctx, e, keys, sender, k, m)
	if err != nil {
		return res, err
	}
	defer stopWorkers()

	// The lead covers the VACUUM below: the stream must not start overdue.
	moved := time.Now()
	start := moved.Add(2 * time.Second)
	if _, err := s.pool.Exec(ctx, stmt("ShiftDue"), pgx.NamedArgs{"start": start, "seeded": seeded}); err != nil {
		return res, fmt.Errorf("moving the stream's due times: %w", err)
	}
	if _, err := s.pool.Exec(ctx, stmt("VacuumAfterShift")); err != nil {
		return res, fmt.Errorf("vacuuming after the move: %w", err)
	}
	d, pub := s.dispatcher(e, keys, m)
	defer pub.Close()
	d.Config.MinGap = latencyMinGap // 0: the product's default
	d.AfterRun = func(ctx context.Context, sum dispatch.Summary, err error) {
		res.Passes += sum.Passes // read once the loop has returned
		if err != nil && ctx.Err() == nil {
			res.FailedPasses = append(res.FailedPasses, err.Error()) // read once the loop has returned
		}
	}
	dctx, cancel := context.WithCancel(ctx)
	loopDone := make(chan struct{})
	go func() { defer close(loopDone); _ = d.Loop(dctx, every) }()
	stopDispatcher := sync.OnceFunc(func() { cancel(); <-loopDone })
	defer stopDispatcher()

	// The measurement starts when the first measured reminder is due; the
	// event trail is read for the reminders due from half a gap before it
	// (the database keeps microseconds), every one without a warm-up.
	from := start.Add(time.Duration(warm) * gap)
	measured := time.Time{}
	if warm > 0 {
		measured = from.Add(-gap / 2)
	}
	if warm > 0 {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(time.Until(from)):
		}
	}
	wal0, err := walStart(ctx, s.pool)
	if err != nil {
		return res, err
	}
	ckpt0 := checkpointsStarted(ctx, s.pool)
	cpu0 := readCPU()
	mach := markMachine()
	hist0, err := gatherHopHistograms(reg)
	if err != nil {
		return res, err
	}

	// The sends counted include the warm-up's (the fake provider counts
	// from the start), so the loop waits for all total of them; and no
	// reminder can be terminal before it is due, so the database is asked
	// once they are all sent, or (a run whose sends do not all happen) every
	// 5 s from 5 s after the last one is due. Each ask counts the whole
	// state table (tens of milliseconds of a backend): compared with res.N,
	// the loop asked every 200 ms through the stream's last warm-up-length
	// of seconds, about ten counts inside the measurement, whose CPU the
	// PostgreSQL column charged to Nudge and whose backend took a core
	// from the stream where its tail is measured.
	polled := start.Add(time.Duration(max(total-1, 0)) * gap) // the last one's due time
	timeout := time.After(limit)
	terminal := 0
	for {
		if pollDB(&sent, total, polled) {
			polled = time.Now()
			var past int
			if err := s.pool.QueryRow(ctx, stmt("StateCounts")).Scan(&past, &terminal); err != nil {
				return res, fmt.Errorf("polling progress: %w", err)
			}
			if terminal >= total {
				break
			}
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-timeout:
			return res, fmt.Errorf("only %d of %d reminders terminal %s after the stream started", terminal, total, limit)
		case <-time.After(200 * time.Millisecond):
		}
	}
	stopDispatcher()
	e.measuredSince(from)
	res.Machine = mach.since()
	res.CPU = readCPU().sub(cpu0)
	res.Checkpoints = -1
	if ckpt1 := checkpointsStarted(ctx, s.pool); ckpt0 >= 0 && ckpt1 >= 0 {
		res.Checkpoints = ckpt1 - ckpt0
	}
	if res.WAL, err = wal0.since(ctx, s.pool); err != nil {
		return res, err
	}

	if err := s.pool.QueryRow(ctx, stmt("StreamSpan"), pgx.NamedArgs{"from": measured}).Scan(&res.Delivered, &res.FirstDue, &res.LastTerminal); err != nil {
		return res, fmt.Errorf("reading the stream's span: %w", err)
	}
	res.Achieved = float64(res.Delivered) / res.LastTerminal.Sub(res.FirstDue).Seconds()
	if res.Hops, res.Overtaken, res.NoEnqueue, err = readHops(ctx, s, measured); err != nil {
		return res, err
	}
	hist, err := gatherHopHistograms(reg)
	if err != nil {
		return res, err
	}
	res.Hist = summarizeHopHistograms(hist, hist0)
	return res, nil
}

func readHops(ctx context.Context, s *nudgeSetup, from time.Time) (hops map[string]hopLatency, overtaken, noEnqueue int, err error) {
	rows, err := s.pool.Query(ctx, stmt("Hops"), pgx.NamedArgs{"from": from})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("reading hop latencies: %w", err)
	}
	defer rows.Close()
	hops = map[string]hopLatency{}
	for rows.Next() {
		var hop string
		var h hopLatency
		var p50, p90, p99, mx *float64 // NULL when a hop has no complete pair
		if err := rows.Scan(&hop, &h.Count, &h.Negative, &p50, &p90, &p99, &mx, &overtaken, &noEnqueue); err != nil {
			return nil, 0, 0, fmt.Errorf("reading hop latencies: %w", err)
		}
		if p50 != nil {
			h.P50, h.P90, h.P99, h.Max = *p50, *p90, *p99, *mx
		}
		hops[hop] = h
	}
	if err := rows.Err(); err != nil {
		return nil, 0, 0, fmt.Errorf("reading hop latencies: %w", err)
	}
	return hops, overtaken, noEnqueue, nil
}

// hopCounts is one hop's histogram summed over channels: its count and the
// cumulative count at each upper bound.
type hopCounts struct {
	count   uint64
	buckets map[float64]uint64
}

// gatherHopHistograms sums nudge_hop_latency_seconds over channels, per hop.
func gatherHopHistograms(reg prometheus.Gatherer) (map[string]hopCounts, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("gathering hop histograms: %w", err)
	}
	byHop := map[string]hopCounts{}
	for _, mf := range mfs {
		if mf.GetName() != "nudge_hop_latency_seconds" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			hop := labelValue(mt, "hop")
			a, ok := byHop[hop]
			if !ok {
				a = hopCounts{buckets: map[float64]uint64{}}
			}
			h := mt.GetHistogram()
			a.count += h.GetSampleCount()
			for _, b := range h.GetBucket() {
				a.buckets[b.GetUpperBound()] += b.GetCumulativeCount()
			}
			byHop[hop] = a
		}
	}
	return byHop, nil
}

// summarizeHopHistograms is each hop's histogram since an earlier gather
// (before: the samples up to then are subtracted; nil subtracts nothing):
// the buckets its p50 and p99 fall in and its share at or under 50 ms.
func summarizeHopHistograms(now, before map[string]hopCounts) map[string]hopHistogram {
	out := map[string]hopHistogram{}
	for hop, a := range now {
		b := before[hop] // zero when the hop had no sample before
		bounds := make([]float64, 0, len(a.buckets))
		for ub := range a.buckets {
			bounds = append(bounds, ub)
		}
		sort.Float64s(bounds)
		cum := make([]uint64, len(bounds))
		for i, ub := range bounds {
			cum[i] = a.buckets[ub] - b.buckets[ub]
		}
		h := hopHistogram{Count: a.count - b.count}
		if h.Count > 0 {
			if i := sort.SearchFloat64s(bounds, 0.05); i < len(bounds) && bounds[i] == 0.05 {
				h.Under50ms = float64(cum[i]) / float64(h.Count)
			}
			h.P50 = quantileBucket(0.5, bounds, cum, h.Count)
			h.P99 = quantileBucket(0.99, bounds, cum, h.Count)
		}
		out[hop] = h
	}
	return out
}

// quantileBucket is the upper bound of the bucket quantile q falls in
// (+Inf past the last finite bound).
func quantileBucket(q float64, bounds []float64, cum []uint64, total uint64) float64 {
	rank := q * float64(total)
	for i, ub := range bounds {
		if float64(cum[i]) >= rank {
			return ub
		}
	}
	return math.Inf(1)
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
