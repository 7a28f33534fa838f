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
// shared limiter; when none comes within maxSlotWait (well inside the send
// lease) it gives up instead of sending late or past its lease.
func TestMissedSlotReservesAnotherOrGivesUp(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	cfg, err := ratelimit.Parse([]byte(`{"version":"t","channels":{"sms":{"account":"a","rate":0.5,"burst":1}}}`))
	require.NoError(t, err)
	now := time.Now()
	w := &Worker{
		cfg:   Config{Channel: "sms", SendLease: 4 * time.Second}.withDefaults(),
		clock: clock.Real{}, log: zerolog.Nop(), fleet: ratelimit.New(db.Pool, cfg),
	}
	require.Equal(t, time.Second, w.maxSlotWait())
	late := func() *item {
		return &item{row: store.Delivery{ID: 1, Tenant: "acme", Deadline: now.Add(time.Hour)}, sendAt: time.Now().Add(-time.Second)}
	}

	// The account is free: a new slot (after the lead), and the send may start.
	it := late()
	require.True(t, w.awaitSlot(ctx, it))
	require.WithinDuration(t, time.Now(), it.sendAt, 200*time.Millisecond)
	require.EqualValues(t, 1, w.counts.slotsMissed.Load())

	// That slot used the account's only token; the next is 2 s away, past
	// the 1 s this attempt may wait: it gives up at once, without sleeping.
	it = late()
	began := time.Now()
	require.False(t, w.awaitSlot(ctx, it))
	require.Less(t, time.Since(began), 500*time.Millisecond)
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
	_, err = lim.Acquire(ctx, time.Now(), "sms", "acme", 1, 1) // the account's only token
	require.NoError(t, err)
	sender := &countingSender{}
	w := &Worker{
		cfg:   Config{Channel: "sms", SendLease: 4 * time.Second}.withDefaults(),
		topo:  broker.Topology{}.WithDefaults(),
		clock: clock.Real{}, log: zerolog.Nop(), fleet: lim, sender: sender,
	}
	for _, tc := range []struct {
		deadline time.Duration
		want     reminder.State
	}{{time.Hour, reminder.Retrying}, {100 * time.Millisecond, reminder.Expired}} {
		it := &item{row: store.Delivery{ID: 1, Tenant: "acme", Deadline: time.Now().Add(tc.deadline)},
			att: store.Attempt{ReminderID: 1, Fence: 2, Number: 1, AttemptID: 7}, sendAt: time.Now().Add(-time.Second)}
		w.send(ctx, it)
		require.Equal(t, tc.want, it.out.State(), it.out.Reason)
		require.Contains(t, it.out.Reason, "rate_limited")
		require.Zero(t, sender.calls.Load(), "nothing reached the provider")
	}
}
