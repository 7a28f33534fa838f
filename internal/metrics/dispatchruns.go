package metrics

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nudgehq/nudge/internal/pg"
)

// The dispatcher is a CronJob: its process is gone before Prometheus could
// scrape it. So it records what its metrics would say in its dispatch_runs
// row (RecordRun: the run's end, its success, and the hop latencies it
// observed as histogram bucket counts), and the reconciler, which is
// long-running and already serves the table's gauges, exports them
// (DispatchRunCollector). No Pushgateway is needed; one can still be used
// (PushDispatchRun).

// HopCounts are hop latency observations as histogram counts, by hop and
// channel ("due_to_claim/email"): what one dispatcher run observed.
type HopCounts map[string]HopHistogram

// HopHistogram is one histogram's counts: Buckets[i] observations at or
// below LatencyBuckets[i] (cumulative), Count in all, Sum their seconds.
type HopHistogram struct {
	Count   uint64   `json:"count"`
	Sum     float64  `json:"sum"`
	Buckets []uint64 `json:"buckets"`
}

func hopKey(hop, channel string) string { return hop + "/" + channel }

// GatherHops reads the nudge_hop_latency_seconds histograms of g (nil: none).
func GatherHops(g prometheus.Gatherer) (HopCounts, error) {
	out := HopCounts{}
	if g == nil {
		return out, nil
	}
	mfs, err := g.Gather()
	if err != nil {
		return out, fmt.Errorf("gathering hop latencies: %w", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "nudge_hop_latency_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var hop, channel string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "hop":
					hop = l.GetValue()
				case "channel":
					channel = l.GetValue()
				}
			}
			h := m.GetHistogram()
			out[hopKey(hop, channel)] = HopHistogram{Count: h.GetSampleCount(), Sum: h.GetSampleSum(), Buckets: buckets(h)}
		}
	}
	return out, nil
}

// buckets returns h's cumulative counts at LatencyBuckets' bounds.
func buckets(h *dto.Histogram) []uint64 {
	out := make([]uint64, len(LatencyBuckets))
	for _, b := range h.GetBucket() {
		if i := slices.Index(LatencyBuckets, b.GetUpperBound()); i >= 0 {
			out[i] = b.GetCumulativeCount()
		}
	}
	return out
}

// Since returns what was observed after prev was taken (c − prev), without
// the histograms that did not move.
func (c HopCounts) Since(prev HopCounts) HopCounts {
	out := HopCounts{}
	for k, h := range c {
		p := prev[k]
		if h.Count <= p.Count {
			continue
		}
		d := HopHistogram{Count: h.Count - p.Count, Sum: h.Sum - p.Sum, Buckets: make([]uint64, len(h.Buckets))}
		for i := range h.Buckets {
			d.Buckets[i] = h.Buckets[i]
			if i < len(p.Buckets) {
				d.Buckets[i] -= p.Buckets[i]
			}
		}
		out[k] = d
	}
	return out
}

// DispatchRunCollector exports, from dispatch_runs, what the dispatcher's
// runs recorded: the reconciler registers it. It reads only the rows added
// since the previous scrape (by primary key) and adds their hop counts to
// its own histograms, so its nudge_hop_latency_seconds are counters from
// the reconciler's start, as if the dispatcher were scraped:
//
//	nudge_hop_latency_seconds{hop,channel}          due_to_claim and claim_to_enqueue
//	nudge_dispatch_last_success_timestamp_seconds   when the newest successful run finished
//	nudge_dispatch_last_run_timestamp_seconds       when the newest run finished (any outcome)
//	nudge_dispatch_runs_total{result}               recorded runs (ok, error) since the start
//
// The timestamps are absent until a run is recorded. A --every loop
// records its passes merged (dispatch.Dispatcher.Loop): at most one row a
// second while they claim, one a minute while idle, a failed pass at once;
// a CronJob records its every run.
type DispatchRunCollector struct {
	DB pg.Querier
	// Channels have their hop series exported at zero before any run.
	Channels []string
	// Timeout bounds a scrape's statements. Zero value: 5 seconds.
	Timeout time.Duration

	mu          sync.Mutex
	started     bool
	after       int64 // the newest dispatch_runs id read
	lastSuccess *time.Time
	lastRun     *time.Time
	runs        map[string]uint64
	hops        HopCounts
	descs       struct{ hop, success, run, runs *prometheus.Desc }
	once        sync.Once
}

// dispatchHops are the hops a dispatcher run observes.
var dispatchHops = []string{HopDueToClaim, HopClaimToEnqueue}

func (c *DispatchRunCollector) init() {
	c.once.Do(func() {
		c.descs.hop = prometheus.NewDesc("nudge_hop_latency_seconds",
			"Time a reminder spent on each hop: due_to_claim, claim_to_enqueue, enqueue_to_start, start_to_terminal.",
			[]string{"hop", "channel"}, nil)
		c.descs.success = prometheus.NewDesc("nudge_dispatch_last_success_timestamp_seconds",
			"Unix time the newest successful dispatcher run finished (from dispatch_runs).", nil, nil)
		c.descs.run = prometheus.NewDesc("nudge_dispatch_last_run_timestamp_seconds",
			"Unix time the newest dispatcher run finished, whatever its outcome (from dispatch_runs).", nil, nil)
		c.descs.runs = prometheus.NewDesc("nudge_dispatch_runs_total",
			"Dispatcher runs recorded in dispatch_runs since this process started, by result (ok, error).",
			[]string{"result"}, nil)
		c.runs = map[string]uint64{"ok": 0, "error": 0}
		c.hops = HopCounts{}
		for _, ch := range c.Channels {
			for _, hop := range dispatchHops {
				c.hops[hopKey(hop, ch)] = HopHistogram{Buckets: make([]uint64, len(LatencyBuckets))}
			}
		}
	})
}

// Start takes the newest run as the starting point (its hops are not
// counted: they happened before this process's counters began) and reads
// the newest run times. Collect calls it when it was not called, or failed.
func (c *DispatchRunCollector) Start(ctx context.Context) error {
	c.init()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.start(ctx)
}

func (c *DispatchRunCollector) start(ctx context.Context) error {
	if c.started {
		return nil
	}
	if err := c.DB.QueryRow(ctx, query("DispatchRunsStart")).Scan(&c.after, &c.lastSuccess, &c.lastRun); err != nil {
		return fmt.Errorf("reading the newest dispatcher run: %w", err)
	}
	c.started = true
	return nil
}

// dispatchRunsPage bounds the rows one statement reads; a scrape reads at
// most a few pages (a CronJob records one row a minute).
const dispatchRunsPage = 1000

// read adds the runs recorded since the last read.
func (c *DispatchRunCollector) read(ctx context.Context) error {
	if err := c.start(ctx); err != nil {
		return err
	}
	for range 10 {
		rows, err := c.DB.Query(ctx, query("DispatchRunsSince"), pgx.NamedArgs{"after": c.after, "limit": dispatchRunsPage})
		if err != nil {
			return fmt.Errorf("reading dispatcher runs: %w", err)
		}
		var (
			id       int64
			finished time.Time
			ok       bool
			raw      []byte
			n        int
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &finished, &ok, &raw}, func() error {
			n++
			c.after = id
			at := finished // each row scans into finished
			if c.lastRun == nil || at.After(*c.lastRun) {
				c.lastRun = &at
			}
			if ok {
				c.runs["ok"]++
				if c.lastSuccess == nil || at.After(*c.lastSuccess) {
					c.lastSuccess = &at
				}
			} else {
				c.runs["error"]++
			}
			var hops HopCounts
			if json.Unmarshal(raw, &hops) != nil {
				return nil // a row this version cannot read: its run still counts
			}
			c.add(hops)
			return nil
		})
		if err != nil {
			return fmt.Errorf("reading dispatcher runs: %w", err)
		}
		if n < dispatchRunsPage {
			return nil
		}
	}
	return nil
}

// add adds hops to the collector's histograms; one whose buckets are not
// LatencyBuckets' (another version's) is skipped.
func (c *DispatchRunCollector) add(hops HopCounts) {
	for k, h := range hops {
		if len(h.Buckets) != len(LatencyBuckets) {
			continue
		}
		acc := c.hops[k]
		if acc.Buckets == nil {
			acc.Buckets = make([]uint64, len(LatencyBuckets))
		}
		acc.Count += h.Count
		acc.Sum += h.Sum
		for i, b := range h.Buckets {
			acc.Buckets[i] += b
		}
		c.hops[k] = acc
	}
}

// Describe implements prometheus.Collector.
func (c *DispatchRunCollector) Describe(ch chan<- *prometheus.Desc) {
	c.init()
	ch <- c.descs.hop
	ch <- c.descs.success
	ch <- c.descs.run
	ch <- c.descs.runs
}

// Collect implements prometheus.Collector. When the database cannot be read
// it exports what it read before (nudge_db_scrape_success, from
// DBCollector, says the database is not answering).
func (c *DispatchRunCollector) Collect(ch chan<- prometheus.Metric) {
	c.init()
	ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(c.Timeout, 5*time.Second))
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = c.read(ctx) // what was read stays; the next scrape goes on from there
	for k, h := range c.hops {
		hop, channel, _ := strings.Cut(k, "/")
		bs := make(map[float64]uint64, len(LatencyBuckets))
		for i, b := range h.Buckets {
			bs[LatencyBuckets[i]] = b
		}
		ch <- prometheus.MustNewConstHistogram(c.descs.hop, h.Count, h.Sum, bs, hop, channel)
	}
	ts := func(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
	if c.lastSuccess != nil {
		ch <- prometheus.MustNewConstMetric(c.descs.success, prometheus.GaugeValue, ts(*c.lastSuccess))
	}
	if c.lastRun != nil {
		ch <- prometheus.MustNewConstMetric(c.descs.run, prometheus.GaugeValue, ts(*c.lastRun))
	}
	for result, n := range c.runs {
		ch <- prometheus.MustNewConstMetric(c.descs.runs, prometheus.CounterValue, float64(n), result)
	}
}
