// Package worker consumes a channel's queue and turns each message into at
// most one provider call per claimed attempt. A message is only a hint: the
// worker re-reads the reminder, discards what is terminal or superseded,
// expires what reached its deadline, claims the attempt with a fenced
// conditional write, sends, records the outcome durably, and only then acks.
// Messages are processed in batches so that the reads and the fenced writes
// of many deliveries share one statement each.
//
// What to do with a message is decided apart from doing it: decide.go holds
// every decision as a pure function of the message, the row, the time, the
// limiter's grant and the provider's answer, tested as a table without
// services; the effect steps (claim, admit, send, publish, settle) carry the
// verdicts out through the narrow Store and publisher interfaces. Every wait
// for time to pass goes through the injected clock, so tests move it.
package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Config tunes a worker. Every zero value has a documented default.
type Config struct {
	// Channel is the channel whose queue this worker consumes. Required.
	Channel reminder.Channel
	// Name identifies the process in the event trail and the broker. Zero value: "<channel>-worker".
	Name string
	// Concurrency is how many batches are processed at once. Zero value: 4.
	Concurrency int
	// Batch is the most deliveries processed together; an envelope
	// (message.Batch) closes a batch, so one holds at most Batch-1 single
	// messages and an envelope's reminders. Zero value: 50.
	Batch int
	// BatchWait is how long a partial batch waits for more deliveries. Zero value: 10ms.
	BatchWait time.Duration
	// Prefetch is how many reminders the worker holds unacked, about: an
	// envelope counts its entries. The broker's window counts messages, so
	// the worker sizes it from what the recent deliveries carried
	// (prefetch.go): Prefetch messages while they are single messages,
	// Prefetch / 50 while they are envelopes of 50, never fewer than
	// 4 × Concurrency messages (so 800 reminders in envelopes of 50 with
	// the defaults), and up to twice that while the mix shifts. Zero value:
	// Concurrency × Batch × 2.
	Prefetch int
	// SendTimeout bounds one provider call; the reminder's deadline bounds
	// it too, whichever comes first. Zero value: 30s.
	SendTimeout time.Duration
	// DeadlineMargin: a send is not started when the reminder's deadline
	// (or its send window's close) is within this margin of now, because
	// the provider would accept it after the deadline; it expires instead
	// (deadline_before_send). Size it above the provider's latency. Zero
	// value (or negative): automatic, twice the p99 of this worker's
	// measured provider-call latencies, at least 100ms and at most
	// SendTimeout, and 1s (at most SendTimeout) before the first call
	// (margin.go).
	DeadlineMargin time.Duration
	// SendLease is how long a claimed attempt is protected from the
	// reconciler. Zero value: SendTimeout + 30s.
	SendLease time.Duration
	// MaxAttempts is the attempt budget of a reminder on this channel. Zero value: 5.
	MaxAttempts int
	// BackoffBase is the first retry delay before jitter. Zero value: 1s.
	BackoffBase time.Duration
	// BackoffMax caps the retry delay. Zero value: 1h.
	BackoffMax time.Duration
	// Grace is how long a stopping worker may take to finish and ack what is
	// in flight; past it, it exits without acking and the broker redelivers.
	// Keep it below the Deployment's terminationGracePeriodSeconds. Zero value: 25s.
	Grace time.Duration
	// Rate limits sends per second in this process; 0 means unlimited.
	Rate float64
	// Burst is the limiter's burst. Zero value: 1 (or Rate rounded up).
	Burst int
	// PoisonAfter: a message delivered this many times before (it was given
	// back by consumers that died or failed on it) is quarantined instead of
	// processed. Keep it below the queue's x-delivery-limit, past which the
	// broker would dead-letter it without saying why. Zero value: the
	// topology's delivery limit minus 2.
	PoisonAfter int
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = string(c.Channel) + "-worker"
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 4
	}
	if c.Batch <= 0 {
		c.Batch = 50
	}
	if c.BatchWait <= 0 {
		c.BatchWait = 10 * time.Millisecond
	}
	if c.Prefetch <= 0 {
		c.Prefetch = c.Concurrency * c.Batch * 2
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = 30 * time.Second
	}
	if c.SendLease <= 0 {
		c.SendLease = c.SendTimeout + 30*time.Second
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = time.Second
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = time.Hour
	}
	if c.Grace <= 0 {
		c.Grace = 25 * time.Second
	}
	if c.Burst <= 0 {
		c.Burst = max(1, int(math.Ceil(c.Rate)))
	}
	return c
}

// Counts are the worker's running totals, for logs and tests.
type Counts struct {
	Delivered, Retried, Failed, Expired, Duplicates, Superseded, Deferred, DeadLettered, Stale, Quarantined int64
	// SlotsMissed counts sends that could not start within
	// ratelimit.SendJitter of their rate-limit slot and reserved another.
	SlotsMissed int64
	// Split counts redelivered envelopes republished as single messages.
	Split int64
	// AckFrames counts the acknowledgement frames (acks, nacks, rejects)
	// sent on consume channels.
	AckFrames int64
	// Windows counts the consumers started anew with another prefetch
	// window (prefetch.go).
	Windows int64
}

// Worker consumes one channel.
type Worker struct {
	cfg     Config
	url     string
	topo    broker.Topology
	declare bool
	store   Store
	sender  provider.Sender
	keys    *message.Keyring
	clock   clock.Clock
	log     zerolog.Logger
	pub     publisher
	m       *metrics.Metrics
	fleet   Limiter
	limiter *rate.Limiter
	rand    func() float64
	ready   atomic.Bool
	// inflight are sends waiting for their rate-limit slots, outside any batch.
	inflight sync.WaitGroup
	// sends bounds the provider calls in flight at once to Concurrency ×
	// Batch (sendSlots), however many reminders an envelope carries.
	sends chan struct{}
	// latency measures provider calls, for the automatic deadline margin.
	latency latencies
	counts  struct {
		delivered, retried, failed, expired, duplicates, superseded, deferred, dead, stale, quarantined atomic.Int64
		slotsMissed, split, ackFrames, windows                                                          atomic.Int64
	}
}

// sendSlots is how many provider calls a worker makes at once: Concurrency
// batches of Batch reminders, what it made before envelopes could carry
// more than Batch. An envelope of 100 (the dispatcher's burst size) would
// otherwise put Concurrency × 100 sends in flight: as many connections to
// the provider, and as many send goroutines with their grown stacks (the
// worker's peak RSS rose from 37 to 50 MiB against its 48 MiB GOMEMLIMIT,
// docs/benchmarks.md). The batch's statements still cover its whole
// envelope; only the sends queue for a slot.
func sendSlots(cfg Config) int { return cfg.Concurrency * cfg.Batch }

// Deps are the worker's collaborators.
type Deps struct {
	AMQPURL  string
	Topology broker.Topology
	Store    Store
	Sender   provider.Sender
	// Keys verify what the worker consumes and sign its retries; they must
	// cover its channel. A worker is best given its channel's keys only
	// (message.Keyring.ChannelSpec), so it cannot sign another channel's work.
	Keys  *message.Keyring
	Clock clock.Clock
	Log   zerolog.Logger
	// Rand returns a float in [0,1) for backoff jitter. Zero value: math/rand/v2.
	Rand func() float64
	// Metrics receives the worker's counters and hop latencies. Nil: none.
	Metrics *metrics.Metrics
	// Limiter grants fleet-wide send capacity (*ratelimit.Limiter). Nil: none.
	Limiter Limiter
	// DeclareTopology declares the whole topology on each connection instead
	// of checking that the channel's queues and exchanges exist. Zero value:
	// check only.
	DeclareTopology bool
	// PublishTimeout bounds each confirmed publish of retries, deferrals and
	// dead letters. Zero value: broker.DefaultPublishTimeout.
	PublishTimeout time.Duration
}

// Limiter reserves send slots for up to want of a tenant's messages on a
// channel at now (the last fresh of them new, the others waited before), and
// says when the rest can expect their turns.
type Limiter interface {
	Reserve(ctx context.Context, now time.Time, f ratelimit.Flow, want, fresh int) (ratelimit.Grant, error)
}

// New returns a worker; Run starts it.
func New(cfg Config, d Deps) (*Worker, error) {
	if !cfg.Channel.Valid() {
		return nil, fmt.Errorf("worker channel %q: must be email, sms or webhook", cfg.Channel)
	}
	if d.Keys != nil && !d.Keys.CanSeal(string(cfg.Channel)) {
		return nil, fmt.Errorf("worker channel %s: the signing key %q holds no key for it (a worker's keys come from `nudgectl keys derive --channel %s`)",
			cfg.Channel, d.Keys.ActiveKeyID(), cfg.Channel)
	}
	cfg = cfg.withDefaults()
	topo := d.Topology.WithDefaults()
	if cfg.PoisonAfter <= 0 {
		cfg.PoisonAfter = max(1, topo.DeliveryLimit-2)
	}
	pub := broker.NewPublisher(d.AMQPURL, topo, cfg.Name+"-publisher")
	pub.Timeout = d.PublishTimeout
	w := &Worker{
		cfg: cfg, url: d.AMQPURL, topo: topo, declare: d.DeclareTopology, store: d.Store, sender: d.Sender, keys: d.Keys,
		clock: d.Clock, log: d.Log, rand: d.Rand, m: d.Metrics, fleet: d.Limiter, pub: pub,
		sends: make(chan struct{}, sendSlots(cfg)),
	}
	if w.clock == nil {
		w.clock = clock.Real{}
	}
	if w.rand == nil {
		w.rand = rand.Float64
	}
	if cfg.Rate > 0 {
		w.limiter = rate.NewLimiter(rate.Limit(cfg.Rate), cfg.Burst)
	}
	return w, nil
}

// Ready reports whether the worker is connected and consuming, and may
// publish: while the broker blocks its publisher (a resource alarm) it could
// neither hand retries back nor dead-letter, so it is not ready.
func (w *Worker) Ready() bool {
	blocked, _ := w.pub.Blocked()
	return w.ready.Load() && !blocked
}

// Counts returns the running totals.
func (w *Worker) Counts() Counts {
	c := &w.counts
	return Counts{
		Delivered: c.delivered.Load(), Retried: c.retried.Load(), Failed: c.failed.Load(),
		Expired: c.expired.Load(), Duplicates: c.duplicates.Load(), Superseded: c.superseded.Load(),
		Deferred: c.deferred.Load(), DeadLettered: c.dead.Load(), Stale: c.stale.Load(),
		Quarantined: c.quarantined.Load(), SlotsMissed: c.slotsMissed.Load(), Split: c.split.Load(),
		AckFrames: c.ackFrames.Load(), Windows: c.windows.Load(),
	}
}

// Run consumes until ctx is canceled, reconnecting with backoff whenever the
// broker connection is lost. On cancel it stops consuming, finishes and acks
// what is in flight within Grace, and returns nil. A missing queue or
// exchange ends it with an error wrapping broker.ErrTopologyMissing: waiting
// would not bring it back.
func (w *Worker) Run(ctx context.Context) error {
	defer w.pub.Close()
	w.warm(ctx)
	backoff := 100 * time.Millisecond
	for {
		started := w.clock.Now()
		err := w.session(ctx)
		w.ready.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, broker.ErrTopologyMissing) {
			return err
		}
		if w.clock.Now().Sub(started) > 30*time.Second {
			backoff = 100 * time.Millisecond
		}
		w.log.Warn().Err(err).Dur("retry_in", backoff).Msg("broker session ended; reconnecting")
		select {
		case <-ctx.Done():
			return nil
		case <-clock.After(w.clock, backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// warmer is a Store that can open its database connections before the
// first message (store.Store.Warm).
type warmer interface {
	Warm(ctx context.Context, conns int) error
}

// warmTimeout bounds the warm-up: past it the worker consumes with
// whatever connections are open.
const warmTimeout = 10 * time.Second

// warm opens the store's connections, one per batch slot and one more,
// before the worker consumes (and so before it is ready): a new
// connection's first statements cost the database tens of milliseconds of
// CPU each, which a cold worker otherwise pays while its first messages
// wait (the p99 of a worker's first second: docs/benchmarks.md). A failure
// or a timeout is logged, and the worker starts anyway: its statements
// open connections as they need them, as they would have.
func (w *Worker) warm(ctx context.Context) {
	wm, ok := w.store.(warmer)
	if !ok {
		return
	}
	start := w.clock.Now()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- wm.Warm(wctx, w.cfg.Concurrency+1) }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return
	case <-clock.After(w.clock, warmTimeout):
		cancel()
		err = fmt.Errorf("not done after %s", warmTimeout)
	}
	if err != nil {
		w.log.Warn().Err(err).Msg("database connections not warmed; the first batches open them")
		return
	}
	w.log.Info().Int("connections", w.cfg.Concurrency+1).Dur("took", w.clock.Now().Sub(start)).Msg("database connections warmed")
}

// consume starts a consumer of the channel's queue on ch whose prefetch
// window is window messages.
func (w *Worker) consume(ch *amqp.Channel, window int) (<-chan amqp.Delivery, string, error) {
	if err := ch.Qos(window, 0, false); err != nil {
		return nil, "", fmt.Errorf("setting prefetch: %w", err)
	}
	queue := w.topo.Queue(string(w.cfg.Channel))
	tag := fmt.Sprintf("%s-%d", w.cfg.Name, rand.Int64())
	deliveries, err := ch.Consume(queue, tag, false, false, false, false, nil)
	if err != nil {
		return nil, "", fmt.Errorf("consuming %s: %w", queue, err)
	}
	return deliveries, tag, nil
}

// session consumes on one connection until it is lost or ctx is canceled.
func (w *Worker) session(ctx context.Context) error {
	conn, err := broker.Dial(w.url, w.cfg.Name)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := w.topo.Prepare(conn, w.declare, w.topo.WorkerUses(string(w.cfg.Channel))); err != nil {
		return fmt.Errorf("preparing the broker topology: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening consume channel: %w", err)
	}
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	canceled := ch.NotifyCancel(make(chan string, 1))
	pf := newPrefetch(w.cfg.Prefetch, w.cfg.Concurrency, w.cfg.Batch)
	deliveries, tag, err := w.consume(ch, pf.window)
	if err != nil {
		return err
	}
	w.ready.Store(true)
	w.m.PrefetchWindow(string(w.cfg.Channel), pf.window, false)
	w.log.Info().Str("queue", w.topo.Queue(string(w.cfg.Channel))).Int("prefetch", w.cfg.Prefetch).
		Int("window", pf.window).Msg("consuming")

	// Batches keep running after ctx is canceled (they finish and ack);
	// work is cut only when the grace period runs out.
	work, abort := context.WithCancel(context.WithoutCancel(ctx))
	defer abort()
	batches := make(chan []amqp.Delivery)
	var wg sync.WaitGroup
	for range w.cfg.Concurrency {
		wg.Go(func() {
			for b := range batches {
				w.process(work, b)
			}
		})
	}

	// Every delivery settles through acks, which acknowledges a batch's
	// contiguous run of the oldest unsettled tags in one frame.
	acks := newAckWindow(ch)
	acks.total = &w.counts.ackFrames
	var (
		cur    []amqp.Delivery
		timer  = time.NewTimer(time.Hour)
		timerC <-chan time.Time
		done   = ctx.Done()
		lost   error
	)
	timer.Stop()
	flush := func() {
		timer.Stop()
		timerC = nil
		if len(cur) > 0 {
			batches <- cur
			cur = make([]amqp.Delivery, 0, w.cfg.Batch) // a batch grows without reallocating
		}
	}
	// take adds a delivery to the batch being gathered, and returns the
	// prefetch window the consumer should have now (0: its own).
	take := func(d amqp.Delivery) (window int) {
		acks.received(&d)
		cur = append(cur, d)
		// An envelope (message.Batch) is a batch of its own: up to
		// message.MaxBatchEntries reminders, so it goes at once.
		if len(cur) >= w.cfg.Batch || message.IsBatch(d.Body) {
			flush()
		} else if len(cur) == 1 {
			timer.Reset(w.cfg.BatchWait)
			timerC = timer.C
		}
		return pf.observe(message.BatchLen(d.Body))
	}
loop:
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				break loop
			}
			if take(d) == 0 || done == nil {
				continue
			}
			// A new window is a new consumer (prefetch.go). The library
			// closes the old one's deliveries after cancel-ok, once every
			// delivery sent to it has been handed over; they stay unacked
			// on this channel and settle as any other.
			if err := ch.Cancel(tag, false); err != nil {
				lost = fmt.Errorf("canceling consumer for a new window: %w", err)
				break loop
			}
			for d := range deliveries {
				take(d) // the window below follows them too
			}
			if deliveries, tag, err = w.consume(ch, pf.window); err != nil {
				lost = err
				break loop
			}
			w.counts.windows.Add(1)
			w.m.PrefetchWindow(string(w.cfg.Channel), pf.window, true)
			w.log.Debug().Int("window", pf.window).Float64("reminders_per_message", pf.size).Msg("consuming with a new prefetch window")
		case <-timerC:
			flush()
		case <-done:
			// Stop consuming; the library closes deliveries after cancel-ok,
			// once every delivery already sent to us has been handed over.
			done = nil
			w.ready.Store(false)
			if err := ch.Cancel(tag, false); err != nil {
				lost = fmt.Errorf("canceling consumer: %w", err)
				break loop
			}
		case e := <-connClosed:
			lost = fmt.Errorf("connection closed: %v", e)
			break loop
		case e := <-chClosed:
			lost = fmt.Errorf("channel closed: %v", e)
			break loop
		case <-canceled:
			lost = errors.New("the broker canceled the consumer")
			break loop
		}
	}
	w.ready.Store(false)
	if lost == nil {
		flush()
	} // else: those deliveries died with their channel; the broker redelivers them.
	close(batches)

	// The grace period and the pause below are on the wall clock, not the
	// worker's: what they wait for (the kubelet's termination deadline, the
	// broker settling acks) runs on wall time.
	finished := make(chan struct{})
	go func() { wg.Wait(); w.inflight.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(w.cfg.Grace):
		w.log.Warn().Dur("grace", w.cfg.Grace).Msg("grace period over: exiting without acking what is in flight")
		abort()
		<-finished
	}
	if lost != nil {
		return lost
	}
	// Quorum queues settle acks asynchronously: give them a moment before
	// closing, or acked messages can come back as redeliveries.
	time.Sleep(500 * time.Millisecond)
	_ = ch.Close()
	return nil
}
