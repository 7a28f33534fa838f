package worker

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
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
