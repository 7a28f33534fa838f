// Package dispatch turns due intent into queued work. A run takes one cutoff
// (the time it started) and claims only rows due before it, in bounded
// batches; a claim moves its rows to enqueued under a new fencing token, a
// dispatch lease and one batch number. It publishes each reminder's ID with
// publisher confirms and records one confirmation per batch for what the
// broker confirmed and routed: a row per batch rather than a rewrite of every
// reminder, which is what makes the claim-publish-record loop cheap. Whatever
// was not confirmed goes back to pending at once; the rows of a killed run
// whose confirmation was never recorded return to pending when their lease
// expires (the reconciler looks for the batch's confirmation). A run is
// therefore safe to repeat, to run twice at once, and to kill at any point.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/faults"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// ErrBrokerUnavailable: the broker could not be reached, blocks publishers
// or lacks the topology, so the run (or the reconciler's pass) claimed
// nothing to publish and did only its database work.
var ErrBrokerUnavailable = errors.New("broker unavailable: nothing claimed for publishing")

// Publisher publishes a batch and reports per message whether the broker
// confirmed and routed it. *broker.Publisher implements it.
type Publisher interface {
	PublishBatch(ctx context.Context, msgs []broker.Outgoing) ([]error, error)
}

// Enqueuer publishes claimed reminders and records the outcome. The
// dispatcher and the reconciler share it.
type Enqueuer struct {
	Store     *store.Store
	Publisher Publisher
	Keys      *message.Keyring
	Topology  broker.Topology
	Clock     clock.Clock
	// Actor names the process in the event trail.
	Actor string
	// Metrics receives hop latencies. Nil: none.
	Metrics *metrics.Metrics
	// BrokerReady, when set, says whether publishing can be attempted now
	// (it connects if need be and checks the topology); see CanPublish.
	// Nil: always.
	BrokerReady func(ctx context.Context) error
}

// CanPublish asks BrokerReady before rows are claimed for publishing: a
// claim whose publish then fails goes straight back (a claim→release cycle
// and two events per row), and a republish that fails spends one of the
// row's republishes. The error wraps ErrBrokerUnavailable.
func (e *Enqueuer) CanPublish(ctx context.Context) error {
	if e.BrokerReady == nil {
		return nil
	}
	if err := e.BrokerReady(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrBrokerUnavailable, err)
	}
	return nil
}

// EnqueueResult counts what Enqueue did.
type EnqueueResult struct {
	// Enqueued were confirmed by the broker.
	Enqueued int
	// Released were not confirmed and went back to pending.
	Released int
}

// Enqueue publishes every enqueued reminder of claimed (others, such as those
// the claim expired, are skipped) in a message of its own, records one
// publish confirmation for each batch with confirmed messages, and returns
// the rest to pending. The reconciler's republishes go through it.
func (e *Enqueuer) Enqueue(ctx context.Context, claimed []store.Claimed) (EnqueueResult, error) {
	return e.enqueue(ctx, claimed, 1)
}

// enqueue is Enqueue with up to size reminders of one channel per message
// (message.Batch; size 1 or less: single-reminder messages). A message's
// confirm stands for each of its reminders: one that is not confirmed
// releases them all.
func (e *Enqueuer) enqueue(ctx context.Context, claimed []store.Claimed, size int) (EnqueueResult, error) {
	var res EnqueueResult
	var toPublish []store.Claimed
	for _, c := range claimed {
		if c.State == reminder.Enqueued {
			toPublish = append(toPublish, c)
		}
	}
	if len(toPublish) == 0 {
		return res, nil
	}
	now := e.Clock.Now()
	msgs, of, err := e.messages(toPublish, size, now)
	if err != nil {
		return res, err
	}
	results, pubErr := e.Publisher.PublishBatch(ctx, msgs)
	faults.Inject(faults.DispatcherAfterPublish)
	var failed []store.Fenced
	confirmed := map[int64]int{} // batch → confirmed messages
	var firstErr error
	ok := func(i int) bool { return pubErr == nil && results[of[i]] == nil }
	for i, c := range toPublish {
		f := store.Fenced{ID: c.ID, Fence: c.Fence}
		if ok(i) {
			res.Enqueued++
			if c.Batch != 0 {
				confirmed[c.Batch]++
			}
			continue
		}
		failed = append(failed, f)
		if firstErr == nil {
			firstErr = pubErr
			if firstErr == nil {
				firstErr = results[of[i]]
			}
		}
	}
	// Record with a context that outlives a canceled run: the broker already
	// holds these messages, and the lease would otherwise have to expire.
	recCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if len(confirmed) > 0 {
		at := e.Clock.Now()
		if err := e.Store.ConfirmPublished(recCtx, at, confirmed, e.Actor); err != nil {
			return EnqueueResult{}, err
		}
		for i, c := range toPublish {
			if ok(i) {
				e.Metrics.HopBetween(metrics.HopClaimToEnqueue, string(c.Channel), c.ClaimedAt, at)
			}
		}
	}
	if len(failed) > 0 {
		reason := fmt.Sprintf("publish not confirmed: %v", firstErr)
		released, err := e.Store.Release(recCtx, e.Clock.Now(), failed, e.Actor, reason)
		if err != nil {
			return res, err
		}
		res.Released = len(released)
	}
	if pubErr != nil {
		return res, fmt.Errorf("publishing %d reminders: %w", len(toPublish), pubErr)
	}
	if res.Enqueued == 0 {
		// Not one confirmed (timeouts, nacks, a missing binding): the next
		// batch would fare no better, so the caller stops claiming.
		return res, fmt.Errorf("publishing %d reminders: none confirmed: %w", len(toPublish), firstErr)
	}
	return res, nil
}

// messages seals toPublish into messages: each reminder alone when size is
// 1 or less, else, channel by channel in claim order, message.Batch
// envelopes of up to size (at most message.MaxBatchEntries) reminders,
// evenly filled (envelopeSplit); a lone reminder still goes alone, and a
// batch whose body would be too large is cut in two. of[i] is the message
// that carries toPublish[i].
func (e *Enqueuer) messages(toPublish []store.Claimed, size int, now time.Time) (msgs []broker.Outgoing, of []int, err error) {
	size = min(max(size, 1), message.MaxBatchEntries)
	of = make([]int, len(toPublish))
	if size == 1 {
		msgs = make([]broker.Outgoing, len(toPublish))
		for i, c := range toPublish {
			if msgs[i], err = e.single(c, now); err != nil {
				return nil, nil, err
			}
			of[i] = i
		}
		return msgs, of, nil
	}
	byChannel := map[reminder.Channel][]int{}
	var channels []reminder.Channel
	for i, c := range toPublish {
		if _, seen := byChannel[c.Channel]; !seen {
			channels = append(channels, c.Channel)
		}
		byChannel[c.Channel] = append(byChannel[c.Channel], i)
	}
	var add func(idx []int) error
	add = func(idx []int) error {
		if len(idx) == 1 {
			m, err := e.single(toPublish[idx[0]], now)
			of[idx[0]] = len(msgs)
			msgs = append(msgs, m)
			return err
		}
		m, err := e.batch(toPublish, idx, now)
		if errors.Is(err, message.ErrTooLarge) {
			half := len(idx) / 2
			return errors.Join(add(idx[:half]), add(idx[half:]))
		}
		for _, i := range idx {
			of[i] = len(msgs)
		}
		msgs = append(msgs, m)
		return err
	}
	for _, ch := range channels {
		idx := byChannel[ch]
		start := 0
		for _, n := range envelopeSplit(len(idx), size) {
			if err := add(idx[start : start+n]); err != nil {
				return nil, nil, err
			}
			start += n
		}
	}
	return msgs, of, nil
}

// envelopeSplit is how n reminders of one channel go into envelopes of at
// most size: as few envelopes as size allows, their sizes differing by at
// most one (a pass of 127 in envelopes of 50 is 43, 42, 42, not 50, 50,
// 27): the same messages, but the largest is smaller, and a worker's batch
// (one envelope) ends when its slowest send does, so the pass's tail is
// shorter (docs/benchmarks.md, "Envelopes evenly filled").
func envelopeSplit(n, size int) []int {
	if n <= 0 {
		return nil
	}
	size = max(size, 1)
	k := (n + size - 1) / size
	parts := make([]int, k)
	for i := range parts {
		parts[i] = n / k
		if i < n%k {
			parts[i]++
		}
	}
	return parts
}

// single is the message of one reminder: its id and fence, no idempotency
// key (the worker reads it from the row it claims; see message.Envelope).
func (e *Enqueuer) single(c store.Claimed, now time.Time) (broker.Outgoing, error) {
	body, headers, err := e.Keys.Seal(message.Envelope{
		ReminderID: c.ID, Fence: c.Fence, Channel: string(c.Channel),
		Tenant: c.Tenant, Deadline: c.Deadline, Attempt: c.Attempts, FirstSeen: now,
	})
	if err != nil {
		return broker.Outgoing{}, err
	}
	return e.outgoing(c.Channel, strconv.FormatInt(c.ID, 10)+"-"+strconv.FormatInt(c.Fence, 10), headers, body, now), nil
}

// batch is the message.Batch of the reminders toPublish[idx] (of one
// channel), without idempotency keys, as single.
func (e *Enqueuer) batch(toPublish []store.Claimed, idx []int, now time.Time) (broker.Outgoing, error) {
	first := toPublish[idx[0]]
	b := message.Batch{Channel: string(first.Channel), FirstSeen: now, Entries: make([]message.Entry, len(idx))}
	for j, i := range idx {
		c := &toPublish[i]
		b.Entries[j] = message.Entry{ReminderID: c.ID, Fence: c.Fence, Tenant: c.Tenant,
			Deadline: c.Deadline, Attempt: c.Attempts}
	}
	body, headers, err := e.Keys.SealBatch(b)
	if err != nil {
		return broker.Outgoing{}, err
	}
	// Unique among the messages of a publish (the publisher matches returns
	// by it): the first reminder at its fence, and how many follow.
	id := "b" + strconv.FormatInt(first.ID, 10) + "-" + strconv.FormatInt(first.Fence, 10) + "-" + strconv.Itoa(len(idx))
	return e.outgoing(first.Channel, id, headers, body, now), nil
}

func (e *Enqueuer) outgoing(ch reminder.Channel, id string, headers map[string]any, body []byte, now time.Time) broker.Outgoing {
	return broker.Outgoing{
		Exchange:   e.Topology.WorkExchange(),
		RoutingKey: string(ch),
		Msg: amqp.Publishing{
			MessageId:   id,
			ContentType: "application/json",
			Timestamp:   now,
			Headers:     headers,
			Body:        body,
		},
	}
}

// Config tunes a dispatcher run.
type Config struct {
	// Batch is how many reminders one claim takes. Zero value: 500.
	Batch int
	// Lease is how long a claim holds its rows before the reconciler may
	// return them to pending. Zero value: 2 minutes.
	Lease time.Duration
	// Budget is the most a run may take: no batch starts once the time spent
	// plus the slowest batch so far would pass it. Keep it below the
	// CronJob's activeDeadlineSeconds. Zero value: 4 minutes.
	Budget time.Duration
	// EnvelopeSize is how many reminders of one channel one message carries
	// (a message.Batch envelope, at most message.MaxBatchEntries and at
	// most the envelope limit, envelope_limit.go): one
	// publish, confirm, delivery and ack for that many; 1 is a message per
	// reminder. Workers older than envelopes dead-letter them (the
	// reconciler then republishes each reminder once it is overdue): every
	// worker of the releases since 2026-12-01 reads them (docs/deploy.md).
	// Zero value: 50, the workers' default batch.
	EnvelopeSize int
	// BurstEnvelopeSize is the envelope size while a run works off a burst:
	// a claim that leaves due rows behind (ClaimDueBatch's more: a full
	// claim, or one tenant's share short of it; the 09:00 case). There
	// per-execution cost dominates: each envelope is one claim and one record
	// statement on the worker (~0.4–0.5 ms of PostgreSQL CPU apiece whatever
	// its rows), and waiting reminders wait anyway. A claim that takes
	// everything due (a steady trickle) uses EnvelopeSize, where a smaller
	// envelope is done sooner. Workers of the releases since 2026-12-01
	// accept envelopes of up to 100, this release's up to 200
	// (message.MaxBatchEntries): a run caps it at the envelope limit the
	// database gives (store.EnvelopeLimit: 100 until the after-rollout
	// migration 49, then 200; envelope_limit.go). Zero value: 200
	// (message.MaxBatchEntries), or 1 when EnvelopeSize is 1 (no envelopes
	// at all: the way back to workers older than them, docs/deploy.md);
	// at most 200, never below EnvelopeSize.
	BurstEnvelopeSize int
	// PromoteAhead is H of the due-ordered store (schema 38): a run's
	// promoter passes insert the state rows of lazy reminders due up to H
	// ahead of its clock (never beyond the database's clock plus H, nor
	// plus lazy intake's horizon). Zero value: 1 hour.
	PromoteAhead time.Duration
	// PromoteBatch bounds the lazy reminders one promoter pass reads (a
	// dispatcher down for hours catches up pass by pass, claiming between
	// them). Zero value: 5,000.
	PromoteBatch int
	// PromoteEvery is the least time between two promoter passes of a
	// Loop's passes while nothing needs one (reusePromotion): a pass within
	// it of the last complete sweep, whose cutoff is still below that
	// sweep's final watermark, claims without a promoter pass. Zero value:
	// 1 second; negative: a promoter pass before every claim (as before).
	PromoteEvery time.Duration
	// MinGap is Loop's least time between the starts of two passes: a pass
	// starts when the next pending row is due, but never sooner than MinGap
	// after the last one started (Loop's every bounds it from above; a
	// MinGap above every is every). A steady stream of due rows is worked
	// a pass every MinGap. Zero value: DefaultMinGap.
	MinGap time.Duration
}

// DefaultMinGap is MinGap's zero value (docs/benchmarks.md, "The
// dispatcher's loop wakes when rows are due" and "The loop's minimum gap
// at 25 ms"): at half load it cuts the p99 enqueue→terminal by about a
// third against 50 ms for 12–15% more CPU per reminder; 20 ms gained nothing
// more.
const DefaultMinGap = 25 * time.Millisecond

// DefaultPromoteEvery is PromoteEvery's zero value.
const DefaultPromoteEvery = time.Second

// WithDefaults returns c with each zero (or negative; PromoteEvery: zero)
// field set to its default. It is the one place the defaults are written: the dispatcher's
// flags (internal/fleet) take theirs from it.
func (c Config) WithDefaults() Config {
	if c.Batch <= 0 {
		c.Batch = 500
	}
	if c.Lease <= 0 {
		c.Lease = 2 * time.Minute
	}
	if c.Budget <= 0 {
		c.Budget = 4 * time.Minute
	}
	if c.EnvelopeSize <= 0 {
		c.EnvelopeSize = 50
	}
	c.EnvelopeSize = min(c.EnvelopeSize, message.MaxBatchEntries)
	if c.BurstEnvelopeSize <= 0 {
		c.BurstEnvelopeSize = message.MaxBatchEntries
		if c.EnvelopeSize == 1 {
			c.BurstEnvelopeSize = 1
		}
	}
	c.BurstEnvelopeSize = min(max(c.BurstEnvelopeSize, c.EnvelopeSize), message.MaxBatchEntries)
	if c.PromoteAhead <= 0 {
		c.PromoteAhead = time.Hour
	}
	if c.PromoteBatch <= 0 {
		c.PromoteBatch = 5000
	}
	if c.MinGap <= 0 {
		c.MinGap = DefaultMinGap
	}
	if c.PromoteEvery == 0 { // negative stays: every pass
		c.PromoteEvery = DefaultPromoteEvery
	}
	return c
}

// Dispatcher claims due reminders and enqueues them.
type Dispatcher struct {
	Enqueuer
	Config Config
	Log    zerolog.Logger
	// AfterRun, when set, is called with every run's summary (to record the
	// run's heartbeat and push its metrics).
	AfterRun func(ctx context.Context, sum Summary, err error)

	// lastPromo is the last promoter pass of this dispatcher and the clock
	// when it started (reusePromotion). Passes run one at a time (Loop), so
	// it needs no lock.
	lastPromo   store.Promotion
	lastPromoAt time.Time

	// limit is the envelope limit read last (envelope_limit.go).
	limit envelopeLimit
}

// Summary describes one run, or (from Loop, merged) the passes of a loop
// since the previous summary it reported.
type Summary struct {
	// Passes is how many passes the summary covers: 1 for RunOnce's.
	Passes   int
	Cutoff   time.Time
	Batches  int
	Claimed  int
	Enqueued int
	Expired  int
	Released int
	// Elapsed is the time the passes took (summed over merged ones).
	Elapsed time.Duration
	// OutOfBudget is set when the run stopped because its budget was near,
	// with due work possibly left for the next run.
	OutOfBudget bool
	// BrokerDown is set when the run could not publish and only expired
	// what was past its deadline (ExpireDue).
	BrokerDown bool
	// Promoted are the state rows the run's promoter passes inserted;
	// Final and Through the watermarks after the last one
	// (store.Promotion; Through zero: nothing bounded the claim).
	Promoted int64
	Final    time.Time
	Through  time.Time
	// Hops are the hop latencies the run observed, recorded with it
	// (Report sets them from the process's registry).
	Hops metrics.HopCounts
}

// promote runs one promoter pass (store.Promote) up to the run's clock plus
// H and notes it in sum.
func (d *Dispatcher) promote(ctx context.Context, cfg Config, sum *Summary) (store.Promotion, error) {
	at := d.Clock.Now()
	p, err := d.Store.Promote(ctx, at.Add(cfg.PromoteAhead), cfg.PromoteAhead, cfg.PromoteBatch)
	if err != nil {
		return p, err
	}
	d.lastPromo, d.lastPromoAt = p, at
	sum.Promoted += p.Promoted
	sum.Final, sum.Through = p.Final, p.Through
	return p, nil
}

// reusePromotion reports whether a pass at now with claim cutoff cutoff may
// claim without a promoter pass of its own, on the strength of the last one
// (last, started at lastAt): only if that pass completed its sweep (it did
// not stop at its batch limit: a dispatcher catching up runs one before
// every claim), started less than every ago (every negative: never; a clock
// that went back: never), and cutoff lies below its final watermark.
//
// Why no lazy reminder can become late because of it: below final every
// committed lazy reminder has its state row, and a transaction still in
// flight writes lazy reminders only at least the lazy-intake horizon (2h)
// after its clock, far past final (store.Promote's doc). So a claim up to a
// cutoff below final takes exactly the rows it would have taken after a
// promoter pass: that pass would have inserted state rows due only past
// cutoff. What the skip delays is the promotion of reminders due later,
// those the next sweep reaches (up to H, 1h, ahead), by at most every (1s):
// each is still promoted about H - every before it is due. And the skip
// ends the moment the cutoff reaches final (a sweep held back by a long
// web transaction, a clock that jumped): from then on every pass runs the
// promoter before it claims, as before.
func reusePromotion(last store.Promotion, lastAt, now, cutoff time.Time, every time.Duration) bool {
	if every < 0 || lastAt.IsZero() || !last.SweepDone {
		return false
	}
	if now.Before(lastAt) || now.Sub(lastAt) >= every {
		return false
	}
	return cutoff.Before(last.Final)
}

// RunOnce runs one dispatch pass with the cutoff taken now. It first runs a
// promoter pass (the state rows of lazy reminders due up to H ahead; none
// when the last one is recent enough, reusePromotion), and
// claims only up to the promoter's provisional end when that is before the
// cutoff; while a sweep is incomplete (a dispatcher back after hours), one
// bounded pass runs before each claim. Batches overlap
// by one: while a batch is published and recorded (Enqueue), the next one is
// claimed, so the claim's database work runs beside the broker's confirms
// and the previous record. At most one Enqueue runs at a time, so batches
// are published in claim order. Its envelopes are capped at the envelope
// limit (envelope_limit.go), read at the first run and then at most once a
// minute.
func (d *Dispatcher) RunOnce(ctx context.Context) (Summary, error) {
	start := d.Clock.Now()
	cfg := capEnvelopes(d.Config.WithDefaults(), d.envelopeCap(ctx, start))
	sum := Summary{Passes: 1, Cutoff: start}
	if err := d.CanPublish(ctx); err != nil {
		sum.BrokerDown = true
		err = errors.Join(err, d.expireOnly(ctx, cfg, &sum))
		sum.Elapsed = d.Clock.Now().Sub(start)
		return sum, err
	}
	var promo store.Promotion // SweepDone false: the first iteration runs a pass
	if reusePromotion(d.lastPromo, d.lastPromoAt, start, sum.Cutoff, cfg.PromoteEvery) {
		promo = d.lastPromo // SweepDone: no pass; its final bounds nothing below the cutoff
		sum.Final, sum.Through = promo.Final, promo.Through
	}
	var err error
	var slowest time.Duration
	var running chan enqueued // the previous batch's Enqueue, if any
	collect := func() error {
		if running == nil {
			return nil
		}
		r := <-running
		running = nil
		sum.Enqueued += r.res.Enqueued
		sum.Released += r.res.Released
		return r.err
	}
	for {
		if ctx.Err() != nil {
			break
		}
		if !budgetAllows(d.Clock.Now().Sub(start), slowest, cfg.Budget) {
			sum.OutOfBudget = true
			break
		}
		batchStart := d.Clock.Now()
		if !promo.SweepDone {
			if promo, err = d.promote(ctx, cfg, &sum); err != nil {
				err = errors.Join(err, collect())
				sum.Elapsed = d.Clock.Now().Sub(start)
				return sum, err
			}
		}
		claimed, more, err := d.Store.ClaimDueBatch(ctx, batchStart, promo.ClaimCutoff(sum.Cutoff), cfg.Batch,
			cfg.Lease, d.Actor)
		if err != nil {
			err = errors.Join(err, collect())
			sum.Elapsed = d.Clock.Now().Sub(start)
			return sum, err
		}
		if len(claimed) == 0 {
			if !promo.SweepDone {
				slowest = max(slowest, d.Clock.Now().Sub(batchStart))
				continue // nothing due up to the sweep's cursor yet: its next pass
			}
			break
		}
		sum.Batches++
		sum.Claimed += len(claimed)
		for _, c := range claimed {
			if c.State == reminder.Pending {
				continue // its send window is closed: due again at the next opening
			}
			if c.State == reminder.Expired {
				sum.Expired++
				d.Metrics.Outcome(string(c.Channel), string(reminder.Expired), string(c.Code))
				continue
			}
			d.Metrics.HopBetween(metrics.HopDueToClaim, string(c.Channel), c.DueAt, c.ClaimedAt)
		}
		if err := collect(); err != nil {
			// The previous batch could not be published or recorded (broker
			// or database down). This one is claimed: hand it to Enqueue
			// too, so that what cannot be published goes back to pending now
			// rather than when its lease expires, and end the pass.
			res, err2 := d.enqueue(ctx, claimed, envelopeSize(cfg, more))
			sum.Enqueued += res.Enqueued
			sum.Released += res.Released
			sum.Elapsed = d.Clock.Now().Sub(start)
			return sum, errors.Join(err, err2)
		}
		running = make(chan enqueued, 1)
		go func(claimed []store.Claimed, done chan<- enqueued) {
			res, err := d.enqueue(ctx, claimed, envelopeSize(cfg, more))
			done <- enqueued{res: res, err: err}
		}(claimed, running)
		slowest = max(slowest, d.Clock.Now().Sub(batchStart))
		if !more && promo.SweepDone {
			break // rows released by Enqueue stay for the next pass
		}
	}
	err = collect()
	sum.Elapsed = d.Clock.Now().Sub(start)
	return sum, err
}

// expireOnly is a run that cannot publish: it claims nothing and expires,
// batch by batch within the budget, the due pending rows already past their
// deadline, which would otherwise wait for the broker to come back.
func (d *Dispatcher) expireOnly(ctx context.Context, cfg Config, sum *Summary) error {
	// The promoter first, as RunOnce: a lazy reminder past its deadline
	// expires only once it has its state row.
	var promo store.Promotion
	for ctx.Err() == nil && !promo.SweepDone && d.Clock.Now().Sub(sum.Cutoff) < cfg.Budget {
		var err error
		if promo, err = d.promote(ctx, cfg, sum); err != nil {
			return err
		}
	}
	for ctx.Err() == nil && d.Clock.Now().Sub(sum.Cutoff) < cfg.Budget {
		byChannel, err := ExpireDue(ctx, d.Store.Pool(), d.Clock.Now(), promo.ClaimCutoff(sum.Cutoff), cfg.Batch, d.Actor)
		if err != nil {
			return err
		}
		n := 0
		for ch, k := range byChannel {
			n += k
			d.Metrics.Outcomes(ch, string(reminder.Expired), "deadline_before_dispatch", k)
		}
		sum.Expired += n
		if n < cfg.Batch {
			return nil
		}
	}
	return nil
}

// envelopeSize is the envelope size for a claimed batch (cfg with its
// defaults): the burst size when the claim left due rows behind (more),
// else the steady one.
func envelopeSize(cfg Config, more bool) int {
	if more {
		return cfg.BurstEnvelopeSize
	}
	return cfg.EnvelopeSize
}

// budgetAllows reports whether a run that has spent spent may start another
// batch: only if that batch, were it as slow as the slowest so far, would
// end within budget.
func budgetAllows(spent, slowest, budget time.Duration) bool {
	return spent+slowest < budget
}

type enqueued struct {
	res EnqueueResult
	err error
}

// Loop runs passes until ctx is done. A pass starts when the next pending
// row is due (NextDue, read after each pass), at once when the last pass
// left due rows behind (out of budget), but never sooner than MinGap nor
// later than every after the last pass started; a row written after that
// read waits at most every, as it did for a loop on a fixed tick. A failed
// pass (the broker or the database down) is followed by an exponential
// back-off, every doubled per failure in a row up to maxBackoff, so an
// outage is not met with a claim attempt every interval (pace.wait has
// the whole rule).
//
// The passes' summaries are merged and logged and handed to AfterRun as
// one (worthReporting): a failed or out-of-budget pass at once, on its
// own; passes that claimed at most every reportBusyEvery; idle ones at
// most every reportIdleEvery; what is left when ctx ends. So a stream
// worked a pass every MinGap writes a heartbeat row and a log line a
// second, not one per pass. The waits go through the Clock, so a test moves a
// fake clock instead of sleeping.
func (d *Dispatcher) Loop(ctx context.Context, every time.Duration) error {
	p := pace{Every: every, MinGap: d.Config.WithDefaults().MinGap}
	failures := 0
	var tally Summary
	var reported time.Time
	report := func(sum Summary, err error) {
		d.LogSummary(sum, err)
		if d.AfterRun != nil {
			d.AfterRun(ctx, sum, err)
		}
		reported = d.Clock.Now()
	}
	flush := func() {
		if tally.Passes > 0 {
			report(tally, nil)
			tally = Summary{}
		}
	}
	for {
		start := d.Clock.Now()
		sum, err := d.RunOnce(ctx)
		var next time.Time
		if err == nil && !sum.OutOfBudget && ctx.Err() == nil {
			var perr error
			if next, perr = NextDue(ctx, d.Store.Pool(), sum.Cutoff); perr != nil {
				d.Log.Warn().Err(perr).Msg("reading the next due time") // the next pass at every
			}
		}
		if err != nil || sum.OutOfBudget {
			flush()
			report(sum, err)
		} else {
			tally = tally.merge(sum)
			if ctx.Err() != nil || worthReporting(tally, d.Clock.Now().Sub(reported)) {
				flush()
			}
		}
		if err != nil && ctx.Err() == nil {
			failures++
		} else {
			failures = 0
		}
		select {
		case <-ctx.Done():
			flush()
			return nil
		case <-clock.After(d.Clock, p.wait(start, d.Clock.Now(), sum.OutOfBudget, next, failures)):
		}
	}
}

// pace is Loop's cadence: a pass at most Every and at least MinGap after
// the last one started.
type pace struct {
	Every, MinGap time.Duration
}

// wait is how long Loop waits, at now, before the pass after the one that
// started at start: after failures failed passes in a row, until every
// after start or the back-off, whichever is longer; otherwise until next
// (the next pending row's due time; zero: none is pending), or at once when
// the pass left due rows behind (more), or every after start, whichever
// comes first, but never before MinGap after start.
func (p pace) wait(start, now time.Time, more bool, next time.Time, failures int) time.Duration {
	at := start.Add(p.Every)
	switch {
	case failures > 0:
		return max(at.Sub(now), backoff(p.Every, failures))
	case more:
		at = now
	case !next.IsZero() && next.Before(at):
		at = next
	}
	if floor := start.Add(min(p.MinGap, p.Every)); at.Before(floor) {
		at = floor
	}
	return max(at.Sub(now), 0)
}

// maxBackoff caps Loop's back-off (unless every itself is longer).
const maxBackoff = 30 * time.Second

// backoff is the pause after the failures-th failed run in a row: every
// doubled for each, capped at maxBackoff (or every when that is longer).
func backoff(every time.Duration, failures int) time.Duration {
	limit := max(every, maxBackoff)
	d := every
	for range failures {
		if d >= limit/2 {
			return limit
		}
		d *= 2
	}
	return d
}

// LogSummary writes the one-line summary of a run.
func (d *Dispatcher) LogSummary(sum Summary, err error) {
	ev := d.Log.Info()
	if err != nil && !errors.Is(err, context.Canceled) {
		ev = d.Log.Error().Err(err)
	}
	ev.Int("passes", sum.Passes).Time("cutoff", sum.Cutoff).Int("batches", sum.Batches).Int("claimed", sum.Claimed).
		Int("enqueued", sum.Enqueued).Int("expired", sum.Expired).Int("released", sum.Released).
		Int64("promoted", sum.Promoted).
		Dur("elapsed", sum.Elapsed).Bool("out_of_budget", sum.OutOfBudget).Bool("broker_down", sum.BrokerDown).
		Msg("dispatch run")
}
