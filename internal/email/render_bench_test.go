package email

import (
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/provider"
)

// benchMessage is a reminder with the data the default templates read.
func benchMessage() provider.Message {
	return provider.Message{ReminderID: 1, IdempotencyKey: "bench-1", Tenant: "tenant-1", Recipient: "ada@example.com",
		Template: "course-expiry", Data: map[string]any{"course": "Go 101", "learner": "Ada"},
		Deadline: time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC)}
}

// BenchmarkRender renders the course-expiry template (subject, text and
// HTML) with a reminder's data, as Send does.
//
//	go test ./internal/email -run '^$' -bench '^Benchmark(Render|Build)$' -benchmem -count 6
func BenchmarkRender(b *testing.B) {
	t, err := LoadTemplates("")
	if err != nil {
		b.Fatal(err)
	}
	msg := benchMessage()
	data := map[string]any{"course": "Go 101", "learner": "Ada", "reminder_id": msg.ReminderID,
		"tenant": msg.Tenant, "deadline": msg.Deadline}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := t.Render(msg.Template, data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBuild is all of a send but the SMTP conversation: the data
// map, the render and the go-mail message with its headers.
func BenchmarkBuild(b *testing.B) {
	t, err := LoadTemplates("")
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{Host: "127.0.0.1", From: "nudge@example.com"}, t)
	if err != nil {
		b.Fatal(err)
	}
	msg := benchMessage()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := s.build(msg); err != nil {
			b.Fatal(err)
		}
	}
}
