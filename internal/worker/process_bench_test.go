package worker

import (
	"context"
	"fmt"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/fakesms"
	smsapi "github.com/nudgehq/nudge/internal/sms"
	"github.com/nudgehq/nudge/internal/store"
)

// processCPU is this process's user+system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkProcessBatch is the worker's per-message Go path in process: a
// batch of 50 fresh reminders opened, claimed, sent, recorded and acked,
// on the fakes of batch_test.go (their own cost is a map lookup per row),
// as 50 single-reminder deliveries (envelope=1) or one batch envelope of 50
// (envelope=50, issue 18). allocs/op are per batch; divide by 50 for a
// reminder. The deliveries settle through an ackWindow, as on a real
// channel: ack-frames/op counts the acknowledgement frames it sends.
//
//	go test ./internal/worker -run '^$' -bench ProcessBatch -benchmem -count 6
//
// sender=http sends through sms.Client to the fake SMS provider over
// loopback HTTP (both in this process, as in BenchmarkPipeline) instead of
// the in-process fake; cpu-ns/op is the process's user+system CPU per batch
// (the HTTP exchange waits on the network, so ns/op is mostly idle time).
func BenchmarkProcessBatch(b *testing.B) {
	for _, size := range []int{1, 50} {
		b.Run(fmt.Sprintf("envelope=%d", size), func(b *testing.B) { benchProcessBatch(b, size, false) })
	}
	b.Run("envelope=50/sender=http", func(b *testing.B) { benchProcessBatch(b, 50, true) })
}

func benchProcessBatch(b *testing.B, size int, viaHTTP bool) {
	const n = 50
	f := setupFakes(b)
	if viaHTTP {
		srv := httptest.NewServer(fakesms.New())
		b.Cleanup(srv.Close)
		// As the binaries wire it: the default client, and the adapter's
		// timeout is the worker's send timeout.
		c, err := smsapi.New(smsapi.Config{URL: srv.URL, Timeout: f.w.cfg.SendTimeout})
		if err != nil {
			b.Fatal(err)
		}
		f.w.sender = c
	}
	rows := make([]store.Delivery, n)
	ids := make([]int64, n)
	for i := range rows {
		id := int64(i + 1)
		ids[i] = id
		rows[i] = row(func(r *store.Delivery) {
			r.ID, r.Recipient, r.Template = id, fmt.Sprintf("+1415%07d", id), "course-expiry"
			r.Data = map[string]any{"course": "Go 101"}
		})
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
	var cpu time.Duration
	for iter := 0; b.Loop(); iter++ {
		b.StopTimer()
		for i := range rows {
			r := f.store.rows[rows[i].ID]
			*r = rows[i]
			if viaHTTP {
				r.IdempotencyKey = fmt.Sprintf("bench-%d-%d", iter, r.ID) // a new message for the provider
			}
		}
		for i := range ds {
			win.received(&ds[i])
		}
		f.sender.calls = f.sender.calls[:0]
		f.store.outcomes = f.store.outcomes[:0]
		b.StartTimer()
		cpu0 := processCPU()
		f.w.process(ctx, ds)
		cpu += processCPU() - cpu0
	}
	b.StopTimer()
	b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
	if len(win.open) != 0 || f.w.Counts().Delivered != int64(n*b.N) {
		b.Fatalf("%d deliveries left unsettled, %d delivered of %d", len(win.open), f.w.Counts().Delivered, n*b.N)
	}
	b.ReportMetric(float64(win.frames)/float64(b.N), "ack-frames/op")
}
