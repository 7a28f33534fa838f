package worker

import (
	"context"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/store"
)

// BenchmarkProcessBatch is the worker's per-message Go path in process: a
// batch of 50 fresh reminders opened, claimed, sent, recorded and acked,
// on the fakes of batch_test.go (their own cost is a map lookup per row),
// as 50 single-reminder deliveries (envelope=1) or one batch envelope of 50
// (envelope=50, issue 18). allocs/op are per batch; divide by 50 for a
// reminder. The deliveries settle through an ackWindow, as on a real
// channel: ack-frames/op counts the acknowledgement frames it sends.
//
//	go test ./internal/worker -run '^$' -bench ProcessBatch -benchmem -count 6
func BenchmarkProcessBatch(b *testing.B) {
	for _, size := range []int{1, 50} {
		b.Run(fmt.Sprintf("envelope=%d", size), func(b *testing.B) { benchProcessBatch(b, size) })
	}
}

func benchProcessBatch(b *testing.B, size int) {
	const n = 50
	f := setupFakes(b)
	rows := make([]store.Delivery, n)
	ids := make([]int64, n)
	for i := range rows {
		id := int64(i + 1)
		ids[i] = id
		rows[i] = row(func(r *store.Delivery) { r.ID = id })
		f.addRow(rows[i])
	}
	var ds []amqp.Delivery
	if size == 1 {
		for i := range n {
			ds = append(ds, f.delivery(b, uint64(i+1), ids[i]))
		}
	} else {
		for i := 0; i < n; i += size {
			ds = append(ds, f.envelope(b, uint64(len(ds)+1), ids[i:min(i+size, n)]...))
		}
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
