package sms_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/fakesms"
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
// this process, as in BenchmarkPipeline), through the default client
// ("direct") and through net/http's ("net-http").
//
//	go test ./internal/sms -run '^$' -bench '^Benchmark(Render|Send)$' -benchmem -count 6
func BenchmarkSend(b *testing.B) {
	b.Run("direct", func(b *testing.B) { sendLoop(b, setup(b).client(b, 0)) })
	b.Run("net-http", func(b *testing.B) {
		bb := setup(b)
		bb.netHTTP = true
		sendLoop(b, bb.client(b, 0))
	})
}

// sendLoop sends benchMessage(1), (2), … with c for as long as b runs.
func sendLoop(b *testing.B, c provider.Sender) {
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		if _, err := c.Send(b.Context(), benchMessage(i)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTwilioSend is BenchmarkSend through the Twilio adapter: one
// create (basic auth, a form body) at the fake's Twilio routes over
// loopback, through the default client ("fake", the direct client) and
// through net/http's ("fake-net-http"), and answered in memory by a
// transport that reads the request and returns a canned 201 ("in-memory":
// the client's own cost over net/http, without the fake's and the
// network's).
//
//	go test ./internal/sms -run '^$' -bench '^BenchmarkTwilioSend$' -benchmem -count 6
func BenchmarkTwilioSend(b *testing.B) {
	b.Run("fake", func(b *testing.B) {
		sendLoop(b, setup(b, fakesms.WithTwilioAccount(testAccount, testToken)).twilio(b, 0, nil))
	})
	b.Run("fake-net-http", func(b *testing.B) {
		bb := setup(b, fakesms.WithTwilioAccount(testAccount, testToken))
		bb.netHTTP = true
		sendLoop(b, bb.twilio(b, 0, nil))
	})
	b.Run("in-memory", func(b *testing.B) {
		bb := &bundle{url: "http://twilio.invalid", http: &http.Client{Transport: created{}}, netHTTP: true}
		sendLoop(b, bb.twilio(b, 0, nil))
	})
}

// created answers every request 201 with a message SID, after reading its body.
type created struct{}

func (created) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(`{"sid":"SM123","status":"queued"}`)), Request: r}, nil
}
