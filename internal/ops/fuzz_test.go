package ops

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/message"
)

// FuzzDeadLetter feeds the dead-letter parser any body and x-nudge headers,
// signed or not, then records it the way a drop does. A reminder is named
// as verified only by a worker's header or a body that verifies; the read
// keeps at most MaxDeadLetterBody of a body; the audit detail is JSON that
// PostgreSQL's jsonb stores (no \u0000, valid UTF-8) with at most
// MaxAuditBody of the body.
func FuzzDeadLetter(f *testing.F) {
	keys, err := message.ParseKeys("test:0123456789abcdef0123")
	if err != nil {
		f.Fatal(err)
	}
	body, _, err := keys.Seal(message.Envelope{ReminderID: 42, Fence: 3, Channel: "email", Tenant: "acme",
		Deadline: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(body, "quarantined: the send panicked", "42", "2026-01-01T00:00:00Z", "msg-1", true)
	f.Add(body, "", "43", "", "", true)
	f.Add([]byte(`{"id": "not a number"}`), "unverifiable: message is not signed", "", "yesterday", "dead-1", false)
	f.Add([]byte("\x00\xff junk"), "x\x00y", "-1", "", "a\x00b\xff", false)
	f.Add([]byte(strings.Repeat("é", 10000)), strings.Repeat("r", 3000), "99999999999999999999", "", "", false)
	f.Fuzz(func(t *testing.T, body []byte, reason, reminderID, deadline, messageID string, sign bool) {
		headers := amqp.Table{message.HeaderReason: reason, message.HeaderReminderID: reminderID,
			message.HeaderDeadline: deadline, message.HeaderReceiveCount: int64(3)}
		if sign {
			for k, v := range message.SignForTest(keys, body) {
				headers[k] = v
			}
		}
		m := DLQ{Keys: keys}.parse(amqp.Delivery{Body: body, Headers: headers, MessageId: messageID}, 1)
		if m.Position != 1 || m.BodyBytes != len(body) || len(m.Body) > MaxDeadLetterBody || !strings.HasPrefix(string(body), m.Body) {
			t.Fatalf("read %d of %d body bytes (position %d)", len(m.Body), m.BodyBytes, m.Position)
		}
		if m.Verified && m.ReminderID <= 0 {
			t.Fatalf("verified without a reminder: %d", m.ReminderID)
		}
		if env, err := keys.Open(body, headers); err == nil && m.ReminderID != env.ReminderID && m.Verified {
			if hdr := headerString(headers, message.HeaderReminderID); hdr == "" {
				t.Fatalf("verified reminder %d, the signed body names %d", m.ReminderID, env.ReminderID)
			}
		}

		det := auditDetail(&DLQItem{Message: m, Verdict: VerdictDrop, Detail: "fuzz"})
		if !utf8.Valid(det) || strings.Contains(string(det), `\u0000`) {
			t.Fatalf("an audit detail jsonb refuses: %s", det)
		}
		var got struct {
			Body      *string `json:"body"`
			Base64    *string `json:"body_base64"`
			Bytes     int     `json:"body_bytes"`
			Truncated bool    `json:"body_truncated"`
		}
		if err := json.Unmarshal(det, &got); err != nil {
			t.Fatalf("an audit detail that is not JSON: %v", err)
		}
		if m.ReminderID != 0 && m.Verified {
			return // the body is not recorded
		}
		kept := 0
		switch {
		case got.Body != nil:
			kept = len(*got.Body)
		case got.Base64 != nil:
			raw, err := base64.StdEncoding.DecodeString(*got.Base64)
			if err != nil {
				t.Fatal(err)
			}
			kept = len(raw)
		default:
			t.Fatal("a dropped message's body is not recorded")
		}
		if kept > MaxAuditBody || got.Bytes != len(body) || got.Truncated != (kept < len(body)) {
			t.Fatalf("audit kept %d of %d body bytes, truncated %v", kept, got.Bytes, got.Truncated)
		}
	})
}
