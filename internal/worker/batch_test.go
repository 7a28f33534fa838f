package worker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// These tests run the worker's batch path (receive, claim, send, record,
// publish, settle) on fakes of its Store and publisher and of the broker's
// acknowledger: what the effects do with each verdict, without PostgreSQL or
// RabbitMQ. The same paths run against the real services in worker_test.go,
// deadletter_test.go and redelivery_test.go.

// fakeStore keeps reminder rows in memory and applies the fenced
// transitions the unlimited path uses.
type fakeStore struct {
	mu       sync.Mutex
	rows     map[int64]*store.Delivery
	fail     error // every call fails with it
	attempts int64
	outcomes []store.Outcome
	// unknown are attempts of unknown outcome, by reminder (lookup_test.go).
	unknown map[int64][]store.UnknownAttempt
	// notes are the reasons of the notes written, by reminder.
	notes map[int64][]string
}

var errNotFaked = errors.New("not in this fake")

func (s *fakeStore) LoadForDelivery(_ context.Context, ids []int64) (map[int64]store.Delivery, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	rows := map[int64]store.Delivery{}
	for _, id := range ids {
		if r, ok := s.rows[id]; ok {
			rows[id] = *r
		}
	}
	return rows, nil
}

func (s *fakeStore) ClaimForDelivery(_ context.Context, now time.Time, channel reminder.Channel, _ string, fs []store.Fenced, _ time.Duration, _ string) (map[int64]store.Delivery, map[int64]store.Attempt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, nil, s.fail
	}
	rows, claimed := map[int64]store.Delivery{}, map[int64]store.Attempt{}
	for _, f := range fs {
		r, ok := s.rows[f.ID]
		if !ok {
			continue
		}
		rows[f.ID] = *r
		if r.Channel == channel && (r.State == reminder.Enqueued || r.State == reminder.Retrying) && r.Fence == f.Fence &&
			!r.DueAt.After(now) && now.Before(r.Deadline) {
			s.attempts++
			r.State, r.Fence, r.Attempts = reminder.Sending, r.Fence+1, r.Attempts+1
			claimed[f.ID] = store.Attempt{ReminderID: f.ID, Fence: r.Fence, Number: r.Attempts, AttemptID: s.attempts}
		}
	}
	return rows, claimed, nil
}

func (s *fakeStore) move(fs []store.Fenced, to reminder.State) (map[int64]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	moved := map[int64]bool{}
	for _, f := range fs {
		if r, ok := s.rows[f.ID]; ok && r.Fence == f.Fence && !r.State.Terminal() {
			r.State, moved[f.ID] = to, true
		}
	}
	return moved, nil
}

func (s *fakeStore) ExpireFenced(_ context.Context, _ time.Time, fs []store.Fenced, _, _ string) (map[int64]bool, error) {
	return s.move(fs, reminder.Expired)
}

func (s *fakeStore) ExpireEarly(_ context.Context, _ time.Time, fs []store.Fenced, _, _ string) (map[int64]bool, error) {
	return s.move(fs, reminder.Expired)
}

func (s *fakeStore) ExpireNoWindow(_ context.Context, _ time.Time, fs []store.Fenced, _, _ string) (map[int64]bool, error) {
	return s.move(fs, reminder.Expired)
}

func (s *fakeStore) Quarantine(_ context.Context, _ time.Time, fs []store.Fenced, _, _ string) (map[int64]bool, error) {
	return s.move(fs, reminder.Quarantined)
}

func (s *fakeStore) Defer(context.Context, time.Time, []store.Fenced, []time.Time) (map[int64]bool, error) {
	return nil, errNotFaked
}

func (s *fakeStore) RecordOutcomes(_ context.Context, _ time.Time, os []store.Outcome, _ string) (map[int64]bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	moved := map[int64]bool{}
	for _, o := range os {
		if r, ok := s.rows[o.ReminderID]; ok && r.State == reminder.Sending && r.Fence == o.Fence {
			r.State, moved[o.ReminderID] = o.State(), true
			s.outcomes = append(s.outcomes, o)
		}
	}
	return moved, nil
}

func (s *fakeStore) UnknownAttempts(_ context.Context, ids, except []int64) (map[int64][]store.UnknownAttempt, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return nil, s.fail
	}
	out := map[int64][]store.UnknownAttempt{}
	for _, id := range ids {
		for _, a := range s.unknown[id] {
			if !slices.Contains(except, a.AttemptID) {
				out[id] = append(out[id], a)
			}
		}
	}
	return out, nil
}

func (s *fakeStore) AttemptProvider(context.Context, int64, string) error { return nil }

func (s *fakeStore) FoundAtProvider(_ context.Context, _ time.Time, fs []store.Fenced, _, _ string) (map[int64]bool, error) {
	return s.move(fs, reminder.Delivered)
}

func (s *fakeStore) NoteEvents(_ context.Context, _ time.Time, _ reminder.Code, ids []int64, reasons []string, _ string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.notes == nil {
		s.notes = map[int64][]string{}
	}
	var n int64
	for i, id := range ids {
		if _, ok := s.rows[id]; ok {
			s.notes[id] = append(s.notes[id], reasons[i])
			n++
		}
	}
	return n, nil
}

func (s *fakeStore) state(id int64) reminder.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rows[id].State
}

// fakePub confirms every publish, unless blocked.
type fakePub struct {
	mu      sync.Mutex
	sent    []broker.Outgoing
	blocked bool
}

func (p *fakePub) Blocked() (bool, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blocked, "low on memory"
}

func (p *fakePub) PublishBatch(_ context.Context, msgs []broker.Outgoing) ([]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = append(p.sent, msgs...)
	return make([]error, len(msgs)), nil
}

func (p *fakePub) Close() {}

// fakeAcks records how each delivery tag was settled.
type fakeAcks struct {
	mu      sync.Mutex
	settled map[uint64]string
}

func (a *fakeAcks) set(tag uint64, how string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if prev, ok := a.settled[tag]; ok {
		return errors.New("delivery " + how + " after " + prev)
	}
	a.settled[tag] = how
	return nil
}

func (a *fakeAcks) Ack(tag uint64, _ bool) error { return a.set(tag, "ack") }
func (a *fakeAcks) Nack(tag uint64, _, requeue bool) error {
	if requeue {
		return a.set(tag, "nack-requeue")
	}
	return a.set(tag, "nack")
}
func (a *fakeAcks) Reject(tag uint64, _ bool) error { return a.set(tag, "reject") }

// scriptedSender answers per reminder: an error from errs, or accepted.
type scriptedSender struct {
	mu    sync.Mutex
	errs  map[int64]error
	calls []int64
}

func (s *scriptedSender) Send(_ context.Context, m provider.Message) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, m.ReminderID)
	return "p-1", s.errs[m.ReminderID]
}

type fakeBundle struct {
	w      *Worker
	clock  *clock.Fake
	store  *fakeStore
	pub    *fakePub
	acks   *fakeAcks
	sender *scriptedSender
	keys   *message.Keyring
}

// unitKeys are the root keys of the tests on fakes.
const unitKeys = "unit:0123456789abcdef0123456789abcdef"

func setupFakes(t testing.TB) *fakeBundle {
	t.Helper()
	keys, err := message.ParseKeys(unitKeys)
	require.NoError(t, err)
	return setupFakesFor(t, reminder.SMS, keys)
}

// setupFakesFor is setupFakes for a worker of channel holding keys.
func setupFakesFor(t testing.TB, channel reminder.Channel, keys *message.Keyring) *fakeBundle {
	t.Helper()
	b := &fakeBundle{
		clock: clock.NewFake(t0), store: &fakeStore{rows: map[int64]*store.Delivery{}}, pub: &fakePub{},
		acks: &fakeAcks{settled: map[uint64]string{}}, sender: &scriptedSender{errs: map[int64]error{}}, keys: keys,
	}
	w, err := New(Config{Channel: channel}, Deps{Topology: topo, Store: b.store, Sender: b.sender, Keys: keys,
		Clock: b.clock, Log: zerolog.Nop(), Rand: func() float64 { return 0 }})
	require.NoError(t, err)
	w.pub = b.pub
	b.w = w
	return b
}

// delivery is the message for reminder id at fence 7, as the broker hands it over.
func (b *fakeBundle) delivery(t testing.TB, tag uint64, id int64) amqp.Delivery {
	t.Helper()
	body, headers, err := b.keys.Seal(message.Envelope{ReminderID: id, Fence: 7, Channel: "sms", FirstSeen: t0, Deadline: at(time.Hour)})
	require.NoError(t, err)
	return amqp.Delivery{Acknowledger: b.acks, DeliveryTag: tag, Body: body, Headers: amqp.Table(headers)}
}

func (b *fakeBundle) addRow(r store.Delivery) { b.store.rows[r.ID] = &r }

func TestBatchSettlesEveryVerdictWithoutABroker(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	for id := int64(1); id <= 5; id++ {
		b.addRow(row(func(r *store.Delivery) { r.ID = id }))
	}
	b.store.rows[3].State = reminder.Canceled
	b.store.rows[4].Deadline = t0
	b.store.rows[5].DueAt = at(10 * time.Second)
	b.sender.errs[2] = http503
	tampered := b.delivery(t, 6, 1)
	tampered.Body = append([]byte(nil), tampered.Body...)
	tampered.Body[len(tampered.Body)-2] ^= 1

	b.w.process(context.Background(), []amqp.Delivery{
		b.delivery(t, 1, 1),  // delivered
		b.delivery(t, 2, 2),  // the provider answers 503: retried
		b.delivery(t, 3, 3),  // canceled: superseded
		b.delivery(t, 4, 4),  // at its deadline: expired
		b.delivery(t, 5, 5),  // due in 10 s: deferred
		tampered,             // dead-lettered
		b.delivery(t, 7, 99), // no such reminder: dead-lettered
	})

	require.Equal(t, map[uint64]string{1: "ack", 2: "ack", 3: "ack", 4: "ack", 5: "ack", 6: "ack", 7: "ack"}, b.acks.settled,
		"every message acked after its transition or confirmed copy")
	require.ElementsMatch(t, []int64{1, 2}, b.sender.calls, "only the claimed attempts reached the provider")
	for id, want := range map[int64]reminder.State{1: reminder.Delivered, 2: reminder.Retrying, 3: reminder.Canceled,
		4: reminder.Expired, 5: reminder.Enqueued} {
		require.Equal(t, want, b.store.state(id), "reminder %d", id)
	}
	var routes []string
	var reasons []any
	for _, m := range b.pub.sent {
		routes = append(routes, m.RoutingKey)
		if m.Exchange == topo.DeadExchange() {
			reasons = append(reasons, m.Msg.Headers[message.HeaderReason])
		}
	}
	require.ElementsMatch(t, []string{topo.RetryQueue("sms", time.Second), topo.RetryQueue("sms", 30*time.Second), "sms", "sms"}, routes,
		"the retry (1 s tier), the deferral (10 s: the 30 s tier) and two dead letters")
	require.Len(t, reasons, 2)
	require.Contains(t, reasons, "unknown reminder")
	c := b.w.Counts()
	require.Equal(t, Counts{Delivered: 1, Retried: 1, Expired: 1, Superseded: 1, Deferred: 1, DeadLettered: 2}, c)
}

// A database that stays down is retried with back-off on the worker's
// clock for a minute of it; then the batch is given back to the broker.
func TestDatabaseDownGivesTheBatchBackAfterAMinuteOfTheClock(t *testing.T) {
	t.Parallel()
	b := setupFakes(t)
	b.addRow(row(func(r *store.Delivery) { r.ID = 1 }))
	b.store.fail = errors.New("connection refused")
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.w.process(context.Background(), []amqp.Delivery{b.delivery(t, 1, 1), b.delivery(t, 2, 1)})
	}()
	finished := func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
	waits := 0
	for !finished() {
		// The clock moves only here, once the worker waits on it.
		require.Eventually(t, func() bool { return b.clock.Waiters() == 1 || finished() }, 10*time.Second, time.Millisecond)
		if !finished() {
			waits++
			b.clock.Advance(5 * time.Second) // the longest back-off
		}
	}
	require.Equal(t, map[uint64]string{1: "nack-requeue", 2: "nack-requeue"}, b.acks.settled)
	require.Empty(t, b.sender.calls)
	require.GreaterOrEqual(t, waits, 12, "a minute of back-off, 5 s at a time")
	require.Less(t, b.clock.Now().Sub(t0), 2*time.Minute)
}

// Issue 13, finding 7: a worker whose publisher the broker blocks (a
// resource alarm) said ready. It cannot hand retries back or dead-letter
// then, so it is not ready until the alarm clears.
func TestNotReadyWhileThePublisherIsBlocked(t *testing.T) {
	t.Parallel()
	pub := &fakePub{}
	w := &Worker{pub: pub}
	w.ready.Store(true)
	require.True(t, w.Ready())
	pub.mu.Lock()
	pub.blocked = true
	pub.mu.Unlock()
	require.False(t, w.Ready(), "blocked")
	pub.mu.Lock()
	pub.blocked = false
	pub.mu.Unlock()
	require.True(t, w.Ready())
}
