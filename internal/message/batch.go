package message

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// Batch is a message body that carries many reminders of one channel to one
// worker: the dispatcher's claim batch cut into messages of up to
// MaxBatchEntries (issue 18), so that the broker's per-message cost (a
// confirm, a delivery, an ack) is paid once for many reminders. It is still
// only a list of pointers to work: each entry is what a single Envelope
// carries (the worker claims it at its fence and re-reads the row), and a
// worker splits a Batch into single-reminder messages whenever one entry
// needs a message of its own (a retry, a deferral, a dead letter) and
// whenever the broker redelivers the Batch, so retries, dead letters and
// the queue's delivery limit stay per reminder.
//
// A Batch is signed as an Envelope is, with the key of the channel it names.
// Its body starts with its version ({"v":2,...}): a worker older than the
// format refuses it as malformed (its strict decoder does not know "v") and
// dead-letters it whole; the reminders it named stay enqueued and the
// reconciler republishes each of them, as single messages, once they are
// overdue. So workers are upgraded before the dispatcher sends batches.
type Batch struct {
	// Version is BatchVersion; Seal sets it.
	Version int `json:"v"`
	// Channel is the channel whose queue carries the message.
	Channel string `json:"channel"`
	// FirstSeen is when the message was published.
	FirstSeen time.Time `json:"first_seen"`
	// Entries are the reminders, at most MaxBatchEntries.
	Entries []Entry `json:"entries"`
}

// Entry is one reminder of a Batch: the per-reminder fields of an Envelope.
type Entry struct {
	ReminderID     int64     `json:"id"`
	Fence          int64     `json:"fence"`
	IdempotencyKey string    `json:"key"` // empty since schema version 32: see Envelope
	Tenant         string    `json:"tenant"`
	Deadline       time.Time `json:"deadline"`
	Attempt        int       `json:"attempt,omitempty"`
}

// BatchVersion is the version a Batch body carries. A single Envelope has
// none (version 1).
const BatchVersion = 2

// MaxBatchEntries bounds the entries of a Batch: what this release's worker
// accepts and its SealBatch writes. A dispatcher sends envelopes of more than
// PreviousMaxBatchEntries only once no worker of the previous release runs:
// it reads the limit from the database (store.EnvelopeLimit), which the
// after-rollout migration 49 raises to this value (docs/deploy.md).
const MaxBatchEntries = 200

// PreviousMaxBatchEntries is MaxBatchEntries of the previous release: the
// largest envelope its workers accept (they dead-letter a larger one as
// malformed). It is the dispatcher's limit until migration 49 applies.
const PreviousMaxBatchEntries = 100

// MaxBatchBodyBytes bounds a Batch body. An entry is about 90 bytes with a
// short tenant and no idempotency key (since schema version 32), about 160
// with the 70-byte key that dispatchers before it sent, so MaxBatchEntries
// of them take about 18 KiB (31 KiB with keys); the bound leaves room for
// longer tenants and stays below the broker's max_message_size (64 KiB,
// deploy/rabbitmq/rabbitmq.conf) with the headers. A batch that would be
// larger is refused by SealBatch (ErrTooLarge) and the dispatcher cuts it in
// two. Like MaxBodyBytes, it is checked before anything else.
const MaxBatchBodyBytes = 48 << 10

// batchPrefix starts every Batch body SealBatch writes.
var batchPrefix = []byte(`{"v":`)

// IsBatch reports whether body is (or claims to be) a Batch: whether it
// starts as SealBatch's bodies do. Only a signed body is believed.
func IsBatch(body []byte) bool { return bytes.HasPrefix(body, batchPrefix) }

// entryPrefix starts every entry of a Batch body SealBatch writes (Entry's
// first field); inside a JSON string its quotes would be escaped.
var entryPrefix = []byte(`{"id":`)

// BatchLen is how many reminders body carries, unverified: the entries of
// a Batch as SealBatch writes it (1 to MaxBatchEntries), 1 for anything
// else. It sizes flow control before a message is opened; only a signed
// body is believed.
func BatchLen(body []byte) int {
	if !IsBatch(body) {
		return 1
	}
	return min(max(bytes.Count(body, entryPrefix), 1), MaxBatchEntries)
}

// Envelope is entry i of b as a single-reminder message.
func (b *Batch) Envelope(i int) Envelope {
	e := &b.Entries[i]
	return Envelope{
		ReminderID: e.ReminderID, Fence: e.Fence, IdempotencyKey: e.IdempotencyKey, Channel: b.Channel,
		Tenant: e.Tenant, Deadline: e.Deadline, Attempt: e.Attempt, FirstSeen: b.FirstSeen,
	}
}

// SealBatch encodes b (its Version set to BatchVersion) and signs it as Seal
// does. It refuses a batch without entries, with more than MaxBatchEntries,
// or whose body would pass MaxBatchBodyBytes (ErrTooLarge: send it as two).
func (k *Keyring) SealBatch(b Batch) (body []byte, headers map[string]any, err error) {
	if len(b.Entries) == 0 || len(b.Entries) > MaxBatchEntries {
		return nil, nil, fmt.Errorf("sealing a batch of %d reminders: a batch holds 1 to %d", len(b.Entries), MaxBatchEntries)
	}
	mk, cached, ok := k.macKeyFor(k.active, b.Channel)
	if !ok {
		return nil, nil, fmt.Errorf("sealing a batch: %w %q for channel %q", ErrUnknownKey, k.active, b.Channel)
	}
	b.Version = BatchVersion
	body, err = json.Marshal(b)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding a batch: %w", err)
	}
	if len(body) > MaxBatchBodyBytes {
		return nil, nil, fmt.Errorf("encoding a batch of %d reminders: %w: %d bytes, the limit is %d",
			len(b.Entries), ErrTooLarge, len(body), MaxBatchBodyBytes)
	}
	return body, k.signed(mk, cached, b.Channel, body), nil
}

// OpenAll verifies and decodes a message of either format, appending its
// reminders to dst: one for a single-reminder message (as Open), each entry
// of a Batch (batch is then true), with the batch's channel and first-seen
// time. A body longer than MaxBatchBodyBytes, or longer than MaxBodyBytes
// and not a Batch, is refused before anything else (ErrTooLarge). A Batch
// must be signed with its channel's key (there were none before channel
// keys), carry BatchVersion, and hold 1 to MaxBatchEntries entries, each
// with an id.
func (k *Keyring) OpenAll(body []byte, headers map[string]any, dst []Envelope) (envs []Envelope, batch bool, err error) {
	if !IsBatch(body) {
		env, err := k.Open(body, headers)
		if err != nil {
			return dst, false, err
		}
		return append(dst, env), false, nil
	}
	if len(body) > MaxBatchBodyBytes {
		return dst, true, fmt.Errorf("%w: a %d-byte batch, the limit is %d", ErrTooLarge, len(body), MaxBatchBodyBytes)
	}
	var b Batch
	var malformed error
	if !decodeBatch(body, &b) {
		b = Batch{}
		malformed = decodeStrict(body, &b)
	}
	channel := b.Channel
	if malformed != nil && channel == "" {
		channel = channelOf(body)
	}
	if _, err := k.verify(body, headers, channel, false); err != nil {
		return dst, true, err
	}
	switch {
	case malformed != nil:
		return dst, true, fmt.Errorf("%w: %v", ErrMalformed, malformed)
	case b.Version != BatchVersion:
		return dst, true, fmt.Errorf("%w: message version %d, this reader takes 1 and %d", ErrMalformed, b.Version, BatchVersion)
	case b.Channel == "" || len(b.Entries) == 0 || len(b.Entries) > MaxBatchEntries:
		return dst, true, fmt.Errorf("%w: a batch names its channel and holds 1 to %d reminders", ErrMalformed, MaxBatchEntries)
	}
	for i := range b.Entries {
		if b.Entries[i].ReminderID <= 0 {
			return dst, true, fmt.Errorf("%w: entry %d has no id", ErrMalformed, i)
		}
	}
	for i := range b.Entries {
		dst = append(dst, b.Envelope(i))
	}
	return dst, true, nil
}
