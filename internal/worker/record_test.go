package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// heldSender answers at once, except for the reminders in hold, whose sends
// wait until release is closed.
type heldSender struct {
	hold    map[int64]bool
	release chan struct{}
	mu      sync.Mutex
	calls   int
}

func (s *heldSender) Send(ctx context.Context, m provider.Message) (string, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if s.hold[m.ReminderID] {
		<-s.release
	}
	return "p-1", nil
}

// countingStore counts the RecordOutcomes statements.
type countingStore struct {
	*fakeStore
	mu      sync.Mutex
	records []int
}

func (s *countingStore) RecordOutcomes(ctx context.Context, now time.Time, os []store.Outcome, by string) (map[int64]bool, error) {
	s.mu.Lock()
	s.records = append(s.records, len(os))
	s.mu.Unlock()
	return s.fakeStore.RecordOutcomes(ctx, now, os, by)
}

// countedBatch is a worker on fakes whose RecordOutcomes statements are
// counted, and a batch of n messages for as many reminders due now.
func countedBatch(t *testing.T, n int) (*fakeBundle, *countingStore, []amqp.Delivery) {
	t.Helper()
	b := setupFakes(t)
	cs := &countingStore{fakeStore: b.store}
	b.w.store = cs
	batch := make([]amqp.Delivery, 0, n)
	for id := int64(1); id <= int64(n); id++ {
		b.addRow(row(func(r *store.Delivery) { r.ID = id }))
		batch = append(batch, b.delivery(t, uint64(id), id))
	}
	return b, cs, batch
}

// A reminder's outcome is recorded soon after its own send is done, not
// once the slowest send of its batch is: while one send of a batch of 30
// hangs, the other 29 are delivered in the database once they have waited
// recordWait for it, and the slow one follows when its provider answers.
// Every message is acked once the batch is done.
func TestOutcomesAreRecordedAsTheirSendsFinish(t *testing.T) {
	t.Parallel()
	const n = 30
	b, cs, batch := countedBatch(t, n)
	sender := &heldSender{hold: map[int64]bool{n: true}, release: make(chan struct{})}
	b.w.sender = sender
	done := make(chan struct{})
	go func() { defer close(done); b.w.process(context.Background(), batch) }()

	require.Eventually(t, func() bool {
		b.clock.Advance(recordWait) // what is done waits this long for the rest
		for id := int64(1); id < n; id++ {
			if b.store.state(id) != reminder.Delivered {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "the finished sends are recorded while one still waits for its provider")
	require.Equal(t, reminder.Sending, b.store.state(n), "the held send is not recorded before it finishes")
	b.acks.mu.Lock()
	require.Empty(t, b.acks.settled, "nothing is acked before the batch is done")
	b.acks.mu.Unlock()

	close(sender.release)
	<-done
	require.Equal(t, reminder.Delivered, b.store.state(n))
	require.Len(t, b.acks.settled, n)
	for _, how := range b.acks.settled {
		require.Equal(t, "ack", how)
	}
	require.Equal(t, int64(n), b.w.Counts().Delivered)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	require.Equal(t, 1, cs.records[len(cs.records)-1], "the held send is recorded on its own")
}

// A batch whose sends all finish at once is recorded in at most recordShares
// statements, every outcome once.
func TestOutcomesOfABatchTakeFewStatements(t *testing.T) {
	t.Parallel()
	const n = 50
	b, cs, batch := countedBatch(t, n)
	b.w.process(context.Background(), batch)
	cs.mu.Lock()
	defer cs.mu.Unlock()
	require.NotEmpty(t, cs.records)
	require.LessOrEqual(t, len(cs.records), recordShares)
	total := 0
	for _, k := range cs.records {
		total += k
	}
	require.Equal(t, n, total, "every outcome recorded once")
	require.Len(t, b.store.outcomes, n)
	require.Len(t, b.acks.settled, n)
}
