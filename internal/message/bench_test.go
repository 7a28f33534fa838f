package message

import (
	"testing"
	"time"
)

// BenchmarkOpen is the worker's per-message verification: a sealed
// envelope of the usual size opened by a keyring of root secrets (the
// dispatcher's and reconciler's) and by one of channel keys (a worker's).
//
//	go test ./internal/message -run '^$' -bench Open -benchmem -count 6
func BenchmarkOpen(b *testing.B) {
	root, err := ParseKeys("k1:" + rootSecret)
	if err != nil {
		b.Fatal(err)
	}
	spec, err := root.ChannelSpec("sms")
	if err != nil {
		b.Fatal(err)
	}
	smsOnly, err := ParseKeys(spec)
	if err != nil {
		b.Fatal(err)
	}
	env := Envelope{ReminderID: 123456789, Fence: 42, IdempotencyKey: "nudge-0123456789abcdef0123456789abcdef",
		Channel: "sms", Tenant: "tenant-3", Deadline: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		FirstSeen: time.Date(2026, 1, 2, 2, 4, 5, 0, time.UTC)}
	body, hdr, err := root.Seal(env)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		k    *Keyring
	}{{"root", root}, {"channel", smsOnly}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tc.k.Open(body, hdr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOpenAll is a worker's opening of one batch message of 50
// reminders (the dispatcher's default envelope), signature and decode.
//
//	go test ./internal/message -run '^$' -bench OpenAll -benchmem -count 6
func BenchmarkOpenAll(b *testing.B) {
	k, err := ParseKeys("k1:" + rootSecret)
	if err != nil {
		b.Fatal(err)
	}
	batch := Batch{Channel: "sms", FirstSeen: time.Date(2026, 1, 2, 2, 4, 5, 123456789, time.UTC)}
	for i := range 50 {
		batch.Entries = append(batch.Entries, Entry{ReminderID: 123456789 + int64(i), Fence: 42, Tenant: "tenant-3",
			Deadline: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Attempt: i % 2})
	}
	body, hdr, err := k.SealBatch(batch)
	if err != nil {
		b.Fatal(err)
	}
	dst := make([]Envelope, 0, 50)
	b.ReportAllocs()
	for b.Loop() {
		if dst, _, err = k.OpenAll(body, hdr, dst[:0]); err != nil || len(dst) != 50 {
			b.Fatal(len(dst), err)
		}
	}
}
