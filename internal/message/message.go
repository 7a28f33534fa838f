// Package message is the wire format between the dispatcher and the workers.
// A message carries only a pointer to work (the reminder ID and the fence of
// the lease it was published under), never the content: the worker re-reads
// the current row, so cancellation and edits made while it waited win.
//
// Every body is signed with HMAC-SHA256 under a named key. Several keys can be
// configured: the first signs, all verify, so a key is rotated by adding the
// new one first, waiting for queued messages to drain, then dropping the old.
//
// The MAC is bound to the channel the body names: each message is signed with
// a key derived from the root secret for that channel (ChannelKey), so a
// process given only the SMS key (a worker, KID@sms:HEX) can verify and sign
// SMS work but holds nothing that signs email work. The dispatcher, the
// reconciler and nudgectl keep the root secrets, from which every channel's
// key follows.
package message

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	// IdempotencyKey was the reminder's stable key. The dispatcher leaves
	// it empty since schema version 32 (its claim reads no wide row): the
	// worker takes the key from the row its claim reads, as every release
	// has. The field stays so that messages keep the shape that workers of
	// earlier releases decode strictly.
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
	// keys are the root secrets by key id: each signs and verifies every
	// channel (through ChannelKey), and verifies legacy messages too.
	keys map[string][]byte
	// channelKeys are derived keys held without their root, by key id then
	// channel: each signs and verifies its channel only.
	channelKeys map[string]map[string][]byte
	// order is the key ids as listed, the active one first.
	order []string
	// cache holds the MAC keys that verified or sealed a message, by
	// kidChannel, at most maxCachedKeys of them (cached counts them).
	cache  sync.Map
	cached atomic.Int32
}

// MinSecretLen is the shortest secret accepted (bytes).
const MinSecretLen = 16

// channelKeyLabel prefixes the channel name in the derivation of a channel
// key. Changing it changes every channel key: it is versioned instead.
const channelKeyLabel = "nudge/v1/channel/"

// ChannelKey derives the key that signs and verifies the messages of channel
// from a root secret: HMAC-SHA256(secret, "nudge/v1/channel/"+channel). A
// holder of one channel's key learns nothing about the root secret or the
// other channels' keys.
func ChannelKey(secret []byte, channel string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(channelKeyLabel + channel))
	return m.Sum(nil)
}

// validName reports whether s is a valid key id or channel name: letters,
// digits, '-' and '_'.
func validName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return s != ""
}

// ParseKeys parses a comma-separated list of keys, each either a root secret
// "KID:SECRET" or one channel's derived key "KID@CHANNEL:HEX" (64 hex
// digits, Keyring.ChannelSpec). The first key's id signs; every key verifies. A
// key id is either a root or a set of channel keys, never both. Key ids and
// channels are letters, digits, '-' and '_'.
func ParseKeys(spec string) (*Keyring, error) {
	k := &Keyring{keys: map[string][]byte{}, channelKeys: map[string]map[string][]byte{}}
	for i, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, secret, ok := strings.Cut(part, ":")
		kid, channel, derived := strings.Cut(name, "@")
		if !ok || kid == "" {
			return nil, fmt.Errorf("signing key %d: want KID:SECRET or KID@CHANNEL:HEX", i+1)
		}
		if !validName(kid) {
			return nil, fmt.Errorf("signing key %d: key id %q may hold only letters, digits, '-' and '_'", i+1, kid)
		}
		_, dupRoot := k.keys[kid]
		if derived {
			if !validName(channel) {
				return nil, fmt.Errorf("signing key %d: channel %q may hold only letters, digits, '-' and '_'", i+1, channel)
			}
			key, err := hex.DecodeString(secret)
			if err != nil || len(key) != sha256.Size {
				return nil, fmt.Errorf("signing key %q: a channel key is %d hex digits (nudgectl keys derive)", name, 2*sha256.Size)
			}
			if _, dup := k.channelKeys[kid][channel]; dup || dupRoot {
				return nil, fmt.Errorf("signing key %q is listed twice (or beside its root key %q)", name, kid)
			}
			if k.channelKeys[kid] == nil {
				k.channelKeys[kid] = map[string][]byte{}
			}
			k.channelKeys[kid][channel] = key
		} else {
			if len(secret) < MinSecretLen {
				return nil, fmt.Errorf("signing key %q: secret must be at least %d bytes", kid, MinSecretLen)
			}
			if _, dup := k.channelKeys[kid]; dup || dupRoot {
				return nil, fmt.Errorf("signing key %q is listed twice", kid)
			}
			k.keys[kid] = []byte(secret)
		}
		if !slices.Contains(k.order, kid) {
			k.order = append(k.order, kid)
		}
		k.active = k.order[0]
	}
	if k.active == "" {
		return nil, errors.New("no signing keys: want KID:SECRET[,KID:SECRET...]")
	}
	return k, nil
}

// ActiveKeyID is the id of the key that signs.
func (k *Keyring) ActiveKeyID() string { return k.active }

// Root reports whether the keyring holds root secrets (and so signs and
// verifies every channel), as opposed to channel keys only.
func (k *Keyring) Root() bool { return len(k.keys) > 0 }

// CanSeal reports whether the signing key covers channel.
func (k *Keyring) CanSeal(channel string) bool {
	_, ok := k.channelKey(k.active, channel)
	return ok
}

// ChannelSpec is the key spec of a keyring that holds only channel's keys,
// one for each of this keyring's key ids in order (so the same key signs):
// what a worker of that channel is given. It fails if a key id has no key
// for channel.
func (k *Keyring) ChannelSpec(channel string) (string, error) {
	if !validName(channel) {
		return "", fmt.Errorf("channel %q may hold only letters, digits, '-' and '_'", channel)
	}
	specs := make([]string, len(k.order))
	for i, kid := range k.order {
		key, ok := k.channelKey(kid, channel)
		if !ok {
			return "", fmt.Errorf("%w %q for channel %q", ErrUnknownKey, kid, channel)
		}
		specs[i] = kid + "@" + channel + ":" + hex.EncodeToString(key)
	}
	return strings.Join(specs, ","), nil
}

// channelKey is kid's key for channel: derived from the root secret, or the
// channel key held without it.
func (k *Keyring) channelKey(kid, channel string) ([]byte, bool) {
	if secret, ok := k.keys[kid]; ok {
		return ChannelKey(secret, channel), true
	}
	key, ok := k.channelKeys[kid][channel]
	return key, ok
}

// mac is the MAC of body under key kid's key: HMAC-SHA256(key, kid 0 body).
func mac(key []byte, kid string, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(kid))
	m.Write([]byte{0})
	m.Write(body)
	return m.Sum(nil)
}

// maxCachedKeys bounds the keyring's cache of channel MAC keys. A keyring
// has a few key ids and a few channels; an entry is added only for a key
// that verified a message (or sealed one), so a flood of bodies naming made-up
// channels cannot grow it, and past the bound keys are derived per message.
const maxCachedKeys = 64

// kidChannel names one channel MAC key: a key id and a channel.
type kidChannel struct{ kid, channel string }

// macKey is one channel's MAC key with a pool of HMAC states keyed with it,
// so a message costs neither the key derivation (an HMAC of its own) nor
// the HMAC's set-up. A Keyring never changes after ParseKeys, so an entry
// cannot go stale: a rotated key is a new Keyring (and a new cache).
type macKey struct {
	key  []byte
	pool sync.Pool // of *macState
}

// macState is an HMAC keyed with a macKey's key, with scratch space for
// the key id prefix and the sum, reused across messages.
type macState struct {
	h       hash.Hash
	scratch []byte
	sum     [sha256.Size]byte
}

func newMACKey(key []byte) *macKey {
	m := &macKey{key: key}
	m.pool.New = func() any { return &macState{h: hmac.New(sha256.New, key)} }
	return m
}

// verify reports whether sig (the decoded signature) is the MAC of body by kid.
func (m *macKey) verify(kid string, body, sig []byte) bool {
	st := m.pool.Get().(*macState)
	defer m.pool.Put(st)
	return hmac.Equal(sig, st.mac(kid, body))
}

// sign returns the hex MAC of body by kid.
func (m *macKey) sign(kid string, body []byte) string {
	st := m.pool.Get().(*macState)
	defer m.pool.Put(st)
	return hex.EncodeToString(st.mac(kid, body))
}

// mac is mac(key, kid, body) in st's reused state; the result is valid
// until st goes back to its pool.
func (st *macState) mac(kid string, body []byte) []byte {
	st.h.Reset()
	st.scratch = append(append(st.scratch[:0], kid...), 0)
	st.h.Write(st.scratch)
	st.h.Write(body)
	return st.h.Sum(st.sum[:0])
}

// macKeyFor is kid's MAC key for channel, from the cache or made now (and
// not cached: the caller caches it with keep once it has served).
func (k *Keyring) macKeyFor(kid, channel string) (m *macKey, cached, ok bool) {
	if v, hit := k.cache.Load(kidChannel{kid, channel}); hit {
		return v.(*macKey), true, true
	}
	key, ok := k.channelKey(kid, channel)
	if !ok {
		return nil, false, false
	}
	return newMACKey(key), false, true
}

// keep caches m as kid's MAC key for channel, within maxCachedKeys.
func (k *Keyring) keep(kid, channel string, m *macKey) {
	if k.cached.Load() >= maxCachedKeys {
		return
	}
	if _, loaded := k.cache.LoadOrStore(kidChannel{kid, channel}, m); !loaded {
		k.cached.Add(1)
	}
}

// decodeSig decodes a hex signature into dst, false unless it is exactly
// one SHA-256 MAC.
func decodeSig(dst *[sha256.Size]byte, sig string) bool {
	if len(sig) != 2*sha256.Size {
		return false
	}
	for i := range dst {
		hi, ok1 := unhex(sig[2*i])
		lo, ok2 := unhex(sig[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// channelOf reads the channel a body names leniently, for a body that does
// not decode strictly (Open still has to say whether it was signed) and for
// SignForTest. "" when the body names none.
func channelOf(body []byte) string {
	var b struct {
		Channel string `json:"channel"`
	}
	_ = json.Unmarshal(body, &b)
	return b.Channel
}

// decode decodes body strictly: one JSON object of Envelope's fields and
// nothing after it.
func decode(body []byte, env *Envelope) error { return decodeStrict(body, env) }

// decodeStrict decodes body into v strictly: one JSON object of v's fields
// and nothing after it.
func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if rest := bytes.TrimLeft(body[dec.InputOffset():], " \t\r\n"); len(rest) > 0 {
		return fmt.Errorf("%d bytes after the message", len(rest))
	}
	return nil
}

// Seal encodes env and signs it with the active key's key for env.Channel,
// returning the body and the headers to send. A keyring of channel keys can
// seal only the channels it holds keys for.
func (k *Keyring) Seal(env Envelope) (body []byte, headers map[string]any, err error) {
	mk, cached, ok := k.macKeyFor(k.active, env.Channel)
	if !ok {
		return nil, nil, fmt.Errorf("sealing a message for reminder %d: %w %q for channel %q",
			env.ReminderID, ErrUnknownKey, k.active, env.Channel)
	}
	body, err = json.Marshal(env)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding message for reminder %d: %w", env.ReminderID, err)
	}
	if len(body) > MaxBodyBytes {
		return nil, nil, fmt.Errorf("encoding message for reminder %d: %w: %d bytes, the limit is %d",
			env.ReminderID, ErrTooLarge, len(body), MaxBodyBytes)
	}
	return body, k.signed(mk, cached, env.Channel, body), nil
}

// signed is the headers that sign body with the active key's MAC key mk
// for channel, which it caches once it has served (unless cached already).
func (k *Keyring) signed(mk *macKey, cached bool, channel string, body []byte) map[string]any {
	if !cached {
		k.keep(k.active, channel, mk)
	}
	return map[string]any{
		HeaderKeyID:     k.active,
		HeaderSignature: mk.sign(k.active, body),
	}
}

// Open verifies the signature in headers over body and decodes it. The
// signature must be made with the key of the channel the body names; a
// keyring holding the key id's root secret also accepts a MAC made with the
// root secret itself (messages sealed before channel keys existed, queued
// across the upgrade), a keyring of channel keys does not.
// A body longer than MaxBodyBytes is refused before anything else
// (ErrTooLarge). Open reads single-reminder messages only: a Batch is
// refused as malformed (OpenAll reads both).
func (k *Keyring) Open(body []byte, headers map[string]any) (Envelope, error) {
	var env Envelope
	if len(body) > MaxBodyBytes {
		return env, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(body), MaxBodyBytes)
	}
	// The body is decoded once, before it is verified (it is at most
	// MaxBodyBytes), because the channel it names picks the key; a body
	// that does not decode is still verified first, so that an unsigned
	// one is refused as such, not as malformed.
	malformed := decode(body, &env)
	channel := env.Channel
	if malformed != nil && channel == "" {
		channel = channelOf(body) // the decoder stopped before the channel
	}
	legacy, err := k.verify(body, headers, channel, true)
	if err != nil {
		return Envelope{}, err
	}
	if malformed != nil {
		if IsBatch(body) {
			malformed = errors.New("a batch envelope, which this reader does not take")
		}
		return Envelope{}, fmt.Errorf("%w: %v", ErrMalformed, malformed)
	}
	if env.ReminderID <= 0 || env.Channel == "" {
		return Envelope{}, fmt.Errorf("%w: id and channel are required", ErrMalformed)
	}
	if env.Channel != channel && !legacy {
		return Envelope{}, fmt.Errorf("%w: channel %q, signed for %q", ErrBadSignature, env.Channel, channel)
	}
	return env, nil
}

// verify checks the signature in headers over body with kid's key for
// channel (or, when allowLegacy, the key id's root secret itself: legacy).
func (k *Keyring) verify(body []byte, headers map[string]any, channel string, allowLegacy bool) (legacy bool, err error) {
	kid, _ := headers[HeaderKeyID].(string)
	sig, _ := headers[HeaderSignature].(string)
	if kid == "" || sig == "" {
		return false, ErrUnsigned
	}
	mk, cached, ok := k.macKeyFor(kid, channel)
	if !ok {
		if _, known := k.channelKeys[kid]; known {
			return false, fmt.Errorf("%w %q for channel %q", ErrUnknownKey, kid, channel)
		}
		return false, fmt.Errorf("%w %q", ErrUnknownKey, kid)
	}
	var got [sha256.Size]byte
	if !decodeSig(&got, sig) {
		return false, ErrBadSignature
	}
	if mk.verify(kid, body, got[:]) {
		if !cached {
			k.keep(kid, channel, mk)
		}
		return false, nil
	}
	root, isRoot := k.keys[kid]
	if !allowLegacy || !isRoot || !hmac.Equal(got[:], mac(root, kid, body)) {
		return false, ErrBadSignature
	}
	return true, nil
}

// SignForTest returns headers carrying a valid signature of body by the
// active key (for the channel the body names), for tests that need a signed
// body Seal would not produce.
func SignForTest(k *Keyring, body []byte) map[string]any {
	key, ok := k.channelKey(k.active, channelOf(body))
	if !ok {
		panic("message: SignForTest: the active key does not cover the body's channel")
	}
	return map[string]any{HeaderKeyID: k.active, HeaderSignature: hex.EncodeToString(mac(key, k.active, body))}
}
