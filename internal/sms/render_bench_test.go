package sms

import (
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/provider"
)

// BenchmarkRender renders the course-expiry template as Send does, with
// BenchmarkPipeline's data.
//
//	go test ./internal/sms -run '^$' -bench '^Benchmark(Render|Send)$' -benchmem -count 6
func BenchmarkRender(b *testing.B) {
	t := DefaultTemplates()
	msg := provider.Message{ReminderID: 1, IdempotencyKey: "bench-1", Tenant: "tenant-1", Recipient: "+14150000001",
		Template: "course-expiry", Data: map[string]any{"course": "Go 101"},
		Deadline: time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := render(t, msg, "sms"); err != nil {
			b.Fatal(err)
		}
	}
}
