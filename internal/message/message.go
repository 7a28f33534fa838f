// Package message is the wire format between the dispatcher and the workers.
// A message carries only a pointer to work (the reminder ID and the fence of
// the lease it was published under), never the content: the worker re-reads
// the current row, so cancellation and edits made while it waited win.
//
// Every body is signed with HMAC-SHA256 under a named key. Several keys can be
// configured: the first signs, all verify, so a key is rotated by adding the
// new one first, waiting for queued messages to drain, then dropping the old.
package message

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Header names carried by every message.
const (
	HeaderKeyID     = "x-nudge-kid"
	HeaderSignature = "x-nudge-sig"
)

// Header names a worker adds to a dead letter, beside the broker's own
// x-death. The dead-letter tools read them from whatever worker version
// wrote the message, so a name never changes once released.
const (
	HeaderReason       = "x-nudge-reason"
	HeaderReminderID   = "x-nudge-reminder-id"
	HeaderReceiveCount = "x-nudge-receive-count"
	HeaderFirstSeen    = "x-nudge-first-seen"
	HeaderDeadline     = "x-nudge-deadline"
)

// Envelope is a message body.
type Envelope struct {
	// ReminderID is the reminders row this message points at.
	ReminderID int64 `json:"id"`
	// Fence is the reminder's fencing token when the message was published. A
	// worker may claim the reminder only while the row still has this fence.
	Fence int64 `json:"fence"`
	// IdempotencyKey is the reminder's stable key, for logs and providers.
	IdempotencyKey string `json:"key"`
	// Channel is the channel whose queue carries the message.
	Channel string `json:"channel"`
	// Tenant is for logs and dead-letter inspection; the row is authoritative.
	Tenant string `json:"tenant"`
	// Deadline is the business deadline, for dead-letter inspection.
	Deadline time.Time `json:"deadline"`
	// Attempt counts retry publications of this reminder (0 for the first).
	Attempt int `json:"attempt"`
	// FirstSeen is when the first message for this fence lineage was published.
	FirstSeen time.Time `json:"first_seen"`
	// NotBefore is a rate-limited message's turn: until then it keeps
	// waiting in the retry tiers without asking the limiter again.
	NotBefore time.Time `json:"not_before,omitzero"`
}

// Errors from Open. All mean the message must be dead-lettered, never processed.
var (
	ErrUnsigned     = errors.New("message is not signed")
	ErrUnknownKey   = errors.New("message is signed with an unknown key id")
	ErrBadSignature = errors.New("message signature does not verify")
	ErrMalformed    = errors.New("message body is malformed")
	// ErrTooLarge: the body is longer than MaxBodyBytes. Checked first, so
	// an oversized body costs no HMAC and no decoding.
	ErrTooLarge = errors.New("message body is too large")
)

// MaxBodyBytes bounds a message body. An envelope is a pointer to work,
// about 300 bytes; the largest Seal can produce (a tenant of
// intake.MaxTenantChars four-byte characters) is under 1 KiB. A worker
// refuses anything longer before verifying it, so a junk body cannot make
// it spend memory or CPU; the broker's own max_message_size
// (deploy/rabbitmq/rabbitmq.conf) bounds what reaches it at all.
const MaxBodyBytes = 4 << 10

// Keyring holds the signing keys.
type Keyring struct {
	active string
	keys   map[string][]byte
}

// MinSecretLen is the shortest secret accepted (bytes).
const MinSecretLen = 16

// ParseKeys parses "kid:secret[,kid:secret...]". The first key signs; every
// key verifies. Key ids are letters, digits, '-' and '_'.
func ParseKeys(spec string) (*Keyring, error) {
	k := &Keyring{keys: map[string][]byte{}}
	for i, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		kid, secret, ok := strings.Cut(part, ":")
		if !ok || kid == "" {
			return nil, fmt.Errorf("signing key %d: want KID:SECRET", i+1)
		}
		for _, r := range kid {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return nil, fmt.Errorf("signing key %d: key id %q may hold only letters, digits, '-' and '_'", i+1, kid)
			}
		}
		if len(secret) < MinSecretLen {
			return nil, fmt.Errorf("signing key %q: secret must be at least %d bytes", kid, MinSecretLen)
		}
		if _, dup := k.keys[kid]; dup {
			return nil, fmt.Errorf("signing key %q is listed twice", kid)
		}
		k.keys[kid] = []byte(secret)
		if k.active == "" {
			k.active = kid
		}
	}
	if k.active == "" {
		return nil, errors.New("no signing keys: want KID:SECRET[,KID:SECRET...]")
	}
	return k, nil
}

// ActiveKeyID is the id of the key that signs.
func (k *Keyring) ActiveKeyID() string { return k.active }

func (k *Keyring) mac(kid string, body []byte) []byte {
	m := hmac.New(sha256.New, k.keys[kid])
	m.Write([]byte(kid))
	m.Write([]byte{0})
	m.Write(body)
	return m.Sum(nil)
}

// Seal encodes env and signs it, returning the body and the headers to send.
func (k *Keyring) Seal(env Envelope) (body []byte, headers map[string]any, err error) {
	body, err = json.Marshal(env)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding message for reminder %d: %w", env.ReminderID, err)
	}
	if len(body) > MaxBodyBytes {
		return nil, nil, fmt.Errorf("encoding message for reminder %d: %w: %d bytes, the limit is %d",
			env.ReminderID, ErrTooLarge, len(body), MaxBodyBytes)
	}
	return body, map[string]any{
		HeaderKeyID:     k.active,
		HeaderSignature: hex.EncodeToString(k.mac(k.active, body)),
	}, nil
}

// Open verifies the signature in headers over body and decodes it. A body
// longer than MaxBodyBytes is refused before anything else (ErrTooLarge).
func (k *Keyring) Open(body []byte, headers map[string]any) (Envelope, error) {
	var env Envelope
	if len(body) > MaxBodyBytes {
		return env, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(body), MaxBodyBytes)
	}
	kid, _ := headers[HeaderKeyID].(string)
	sig, _ := headers[HeaderSignature].(string)
	if kid == "" || sig == "" {
		return env, ErrUnsigned
	}
	if _, ok := k.keys[kid]; !ok {
		return env, fmt.Errorf("%w %q", ErrUnknownKey, kid)
	}
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, k.mac(kid, body)) {
		return env, ErrBadSignature
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return env, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if env.ReminderID <= 0 || env.Channel == "" {
		return env, fmt.Errorf("%w: id and channel are required", ErrMalformed)
	}
	return env, nil
}

// SignForTest returns headers carrying a valid signature of body by the
// active key, for tests that need a signed body Seal would not produce.
func SignForTest(k *Keyring, body []byte) map[string]any {
	return map[string]any{HeaderKeyID: k.active, HeaderSignature: hex.EncodeToString(k.mac(k.active, body))}
}
