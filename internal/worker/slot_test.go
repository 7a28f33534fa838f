package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// A claimed attempt that missed its send slot reserves a new one from the
// shared limiter and waits for it on the worker's clock; when none comes
// within maxSlotWait (well inside the send lease) it gives up at once
// instead of sending late or past its lease.
func TestMissedSlotReservesAnotherOrGivesUp(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	cfg, err := ratelimit.Parse([]byte(`{"version":"t","channels":{"sms":{"account":"a","rate":0.5,"burst":1}}}`))
	require.NoError(t, err)
	start := time.Now().Truncate(time.Millisecond)
	fc := clock.NewFake(start)
	w := &Worker{
		cfg:   Config{Channel: "sms", SendLease: 4 * time.Second}.withDefaults(),
		clock: fc, log: zerolog.Nop(), fleet: ratelimit.New(db.Pool, cfg),
	}
	require.Equal(t, time.Second, w.maxSlotWait())
	late := func() *item {
		now := fc.Now()
		return &item{row: store.Delivery{ID: 1, Tenant: "acme", Deadline: now.Add(time.Hour)}, sendAt: now.Add(-time.Second)}
	}

	// The account is free: a new slot, one lead ahead, and the send may
	// start once the clock gets there.
	it := late()
	done := awaitSlotAsync(ctx, w, it)
	require.Eventually(t, func() bool { return fc.Waiters() == 1 }, 10*time.Second, time.Millisecond,
		"waiting on the clock for the new slot")
	fc.Advance(ratelimit.Lead)
	require.True(t, <-done)
	require.WithinDuration(t, start.Add(ratelimit.Lead), it.sendAt, 0, "one lead after the miss")
	require.EqualValues(t, 1, w.counts.slotsMissed.Load())

	// That slot used the account's only token; the next is 2 s away, past
	// the 1 s this attempt may wait: it gives up without waiting at all.
	it = late()
	require.False(t, <-awaitSlotAsync(ctx, w, it))
	require.Zero(t, fc.Waiters(), "nothing waits on the clock")
	require.WithinDuration(t, start.Add(ratelimit.Lead), fc.Now(), 0, "only the test moved the clock")
}

// awaitSlotAsync runs awaitSlot where the test can move the clock meanwhile.
func awaitSlotAsync(ctx context.Context, w *Worker, it *item) <-chan bool {
	done := make(chan bool, 1)
	go func() { done <- w.awaitSlot(ctx, it) }()
	return done
}

// countingSender stands at the provider boundary and counts the calls.
type countingSender struct{ calls atomic.Int64 }

func (s *countingSender) Send(context.Context, provider.Message) (string, error) {
	s.calls.Add(1)
	return "id", nil
}

// A claimed attempt whose slot is missed and that gets no new one in time is
// not sent: it goes back as a retry (or expires at its deadline).
func TestSendGivesUpWithoutSendingWhenNoSlotComes(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	cfg, err := ratelimit.Parse([]byte(`{"version":"t","channels":{"sms":{"account":"a","rate":0.5,"burst":1}}}`))
	require.NoError(t, err)
	lim := ratelimit.New(db.Pool, cfg)
	fc := clock.NewFake(time.Now())
	_, err = lim.Acquire(ctx, fc.Now(), "sms", "acme", 1, 1) // the account's only token
	require.NoError(t, err)
	sender := &countingSender{}
	w := &Worker{
		cfg:   Config{Channel: "sms", SendLease: 4 * time.Second}.withDefaults(),
		topo:  broker.Topology{}.WithDefaults(),
		clock: fc, log: zerolog.Nop(), fleet: lim, sender: sender,
	}
	for _, tc := range []struct {
		deadline time.Duration
		want     reminder.State
	}{{time.Hour, reminder.Retrying}, {100 * time.Millisecond, reminder.Expired}} {
		// The first retry tier (250 ms) fits before an hour, not before 100 ms.
		it := &item{row: store.Delivery{ID: 1, Tenant: "acme", Deadline: fc.Now().Add(tc.deadline)},
			att: store.Attempt{ReminderID: 1, Fence: 2, Number: 1, AttemptID: 7}, sendAt: fc.Now().Add(-time.Second)}
		w.send(ctx, it) // on a fake clock nobody moves: it gives up without waiting
		require.Equal(t, tc.want, it.out.State(), it.out.Reason)
		require.Contains(t, it.out.Reason, "rate_limited")
		require.Zero(t, sender.calls.Load(), "nothing reached the provider")
	}
}

// The process's own rate limit (Config.Rate) paces claims on the worker's
// clock: at 1 a second with a burst of 1, a second send waits for the clock
// to move a second.
func TestLocalRateLimitWaitsOnTheClock(t *testing.T) {
	t.Parallel()
	fc := clock.NewFake(time.Now())
	w, err := New(Config{Channel: reminder.SMS, Rate: 1}, Deps{Clock: fc, Log: zerolog.Nop()})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, w.waitLocal(ctx, 1), "the burst is free")
	require.Zero(t, fc.Waiters())

	done := make(chan error, 1)
	go func() { done <- w.waitLocal(ctx, 1) }()
	require.Eventually(t, func() bool { return fc.Waiters() == 1 }, 10*time.Second, time.Millisecond)
	fc.Advance(999 * time.Millisecond)
	require.Equal(t, 1, fc.Waiters(), "not a second yet")
	fc.Advance(time.Millisecond)
	require.NoError(t, <-done)

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, w.waitLocal(canceled, 1), context.Canceled, "a canceled wait claims nothing")
}
