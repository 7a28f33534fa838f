package sms_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/provider"
)

// benchMessage is the message BenchmarkPipeline sends.
func benchMessage(i int) provider.Message {
	return provider.Message{
		ReminderID: int64(i), IdempotencyKey: "bench-" + strconv.Itoa(i), Tenant: "tenant-1",
		Recipient: "+14150000001", Template: "course-expiry", Data: map[string]any{"course": "Go 101"},
		Deadline: time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC),
	}
}

// BenchmarkSend is one Send to the fake provider over loopback HTTP with a
// pooled connection: the client's and the fake's cost per message (both in
// this process, as in BenchmarkPipeline).
//
//	go test ./internal/sms -run '^$' -bench '^Benchmark(Render|Send)$' -benchmem -count 6
func BenchmarkSend(b *testing.B) {
	c := setup(b).client(b, 0)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		if _, err := c.Send(b.Context(), benchMessage(i)); err != nil {
			b.Fatal(err)
		}
	}
}
