package worker

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/store"
)

// BenchmarkProcessBatch is the worker's per-message Go path in process: a
// batch of 50 fresh deliveries opened, claimed, sent, recorded and acked,
// on the fakes of batch_test.go (their own cost is a map lookup per row).
// allocs/op are per batch; divide by 50 for a message. The deliveries settle
// through an ackWindow, as on a real channel: ack-frames/op counts the
// acknowledgement frames it sends.
//
//	go test ./internal/worker -run '^$' -bench ProcessBatch -benchmem -count 6
func BenchmarkProcessBatch(b *testing.B) {
	const n = 50
	f := setupFakes(b)
	ds := make([]amqp.Delivery, n)
	rows := make([]store.Delivery, n)
	for i := range ds {
		id := int64(i + 1)
		rows[i] = row(func(r *store.Delivery) { r.ID = id })
		f.addRow(rows[i])
		ds[i] = f.delivery(b, uint64(i+1), id)
	}
	ctx := context.Background()
	counted := &recordingAcks{}
	win := newAckWindow(counted)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for i := range rows {
			*f.store.rows[rows[i].ID] = rows[i]
		}
		for i := range ds {
			win.received(&ds[i])
		}
		f.sender.calls = f.sender.calls[:0]
		f.store.outcomes = f.store.outcomes[:0]
		b.StartTimer()
		f.w.process(ctx, ds)
	}
	b.StopTimer()
	if len(win.open) != 0 || f.w.Counts().Delivered != int64(n*b.N) {
		b.Fatalf("%d deliveries left unsettled, %d delivered of %d", len(win.open), f.w.Counts().Delivered, n*b.N)
	}
	b.ReportMetric(float64(win.frames)/float64(b.N), "ack-frames/op")
}
