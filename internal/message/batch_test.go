package message

import (
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func testBatch(n int) Batch {
	b := Batch{Channel: "sms", FirstSeen: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	for i := range n {
		b.Entries = append(b.Entries, Entry{ReminderID: int64(i + 1), Fence: int64(10 + i),
			IdempotencyKey: "nudge-" + strings.Repeat("ab", 32), Tenant: "acme",
			Deadline: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Attempt: i % 2})
	}
	return b
}

func TestBatchRoundTripGivesEachEntryAsAnEnvelope(t *testing.T) {
	t.Parallel()
	k, err := ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)
	b := testBatch(MaxBatchEntries)
	body, hdr, err := k.SealBatch(b)
	require.NoError(t, err)
	require.True(t, IsBatch(body))
	require.Less(t, len(body), MaxBatchBodyBytes*3/4, "a full batch of entries with keys (as before schema 32) is below the bound: %d bytes", len(body))
	keyless := b
	keyless.Entries = slices.Clone(b.Entries)
	for i := range keyless.Entries {
		keyless.Entries[i].IdempotencyKey = ""
	}
	kbody, _, err := k.SealBatch(keyless)
	require.NoError(t, err)
	require.Less(t, len(kbody), MaxBatchBodyBytes/2, "a full batch as today's dispatcher writes it is far below the bound: %d bytes", len(kbody))

	envs, batch, err := k.OpenAll(body, hdr, nil)
	require.NoError(t, err)
	require.True(t, batch)
	require.Len(t, envs, MaxBatchEntries)
	for i, env := range envs {
		require.Equal(t, b.Envelope(i), env)
		require.Equal(t, "sms", env.Channel)
		require.Equal(t, b.FirstSeen, env.FirstSeen)
	}

	// A single message through OpenAll: appended to dst, not a batch.
	single, shdr, err := k.Seal(envs[3])
	require.NoError(t, err)
	require.False(t, IsBatch(single))
	got, batch, err := k.OpenAll(single, shdr, envs[:1])
	require.NoError(t, err)
	require.False(t, batch)
	require.Equal(t, []Envelope{envs[0], envs[3]}, got)
}

// An old reader (Open, which is what a worker before batches calls) refuses
// a batch cleanly, as malformed once its signature verified: it dead-letters
// it rather than processing a part of it.
func TestOpenRefusesABatchAsMalformed(t *testing.T) {
	t.Parallel()
	k, err := ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)
	body, hdr, err := k.SealBatch(testBatch(3))
	require.NoError(t, err)
	_, err = k.Open(body, hdr)
	require.ErrorIs(t, err, ErrMalformed)
	require.Contains(t, err.Error(), "batch")
	// The version-1 decoder (Open before batches existed) fails on "v" as well.
	var env Envelope
	require.ErrorContains(t, decode(body, &env), `unknown field "v"`)
}

func TestOpenAllRefusesBadBatches(t *testing.T) {
	t.Parallel()
	root, err := ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)
	spec, err := root.ChannelSpec("sms")
	require.NoError(t, err)
	smsOnly, err := ParseKeys(spec)
	require.NoError(t, err)
	good, hdr, err := root.SealBatch(testBatch(2))
	require.NoError(t, err)
	_, _, err = smsOnly.OpenAll(good, hdr, nil)
	require.NoError(t, err, "a worker holding the channel's key opens it")

	tampered := []byte(strings.Replace(string(good), `"fence":10`, `"fence":11`, 1))
	email := testBatch(1)
	email.Channel = "email"
	emailBody, emailHdr, err := root.SealBatch(email)
	require.NoError(t, err)
	for name, c := range map[string]struct {
		body []byte
		hdr  map[string]any
		keys *Keyring
		want error
	}{
		"tampered":            {tampered, hdr, root, ErrBadSignature},
		"unsigned":            {good, map[string]any{}, root, ErrUnsigned},
		"other channel's key": {emailBody, emailHdr, smsOnly, ErrUnknownKey},
		"root MAC (legacy)":   {good, map[string]any{HeaderKeyID: "k1", HeaderSignature: legacySig(root, good)}, root, ErrBadSignature},
		"version 3":           {[]byte(`{"v":3,"channel":"sms","first_seen":"2026-01-01T00:00:00Z","entries":[{"id":1}]}`), nil, root, ErrMalformed},
		"no entries":          {[]byte(`{"v":2,"channel":"sms","first_seen":"2026-01-01T00:00:00Z","entries":[]}`), nil, root, ErrMalformed},
		"entry without id":    {[]byte(`{"v":2,"channel":"sms","first_seen":"2026-01-01T00:00:00Z","entries":[{"fence":1}]}`), nil, root, ErrMalformed},
		"unknown field":       {[]byte(`{"v":2,"channel":"sms","id":4,"entries":[{"id":1}]}`), nil, root, ErrMalformed},
		"too many entries":    {[]byte(`{"v":2,"channel":"sms","entries":[` + strings.Repeat(`{"id":1},`, MaxBatchEntries) + `{"id":1}]}`), nil, root, ErrMalformed},
		"too large":           {[]byte(`{"v":2` + strings.Repeat(" ", MaxBatchBodyBytes)), nil, root, ErrTooLarge},
	} {
		if c.hdr == nil {
			c.hdr = SignForTest(root, c.body)
		}
		envs, _, err := c.keys.OpenAll(c.body, c.hdr, nil)
		require.ErrorIs(t, err, c.want, name)
		require.Empty(t, envs, name)
	}
}

func legacySig(k *Keyring, body []byte) string {
	return hex.EncodeToString(mac(k.keys["k1"], "k1", body))
}

func TestSealBatchBounds(t *testing.T) {
	t.Parallel()
	k, err := ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)
	_, _, err = k.SealBatch(testBatch(0))
	require.Error(t, err)
	_, _, err = k.SealBatch(testBatch(MaxBatchEntries + 1))
	require.Error(t, err)
	big := testBatch(MaxBatchEntries)
	for i := range big.Entries {
		big.Entries[i].Tenant = strings.Repeat("<", 128) // escaped: 6 bytes each
	}
	_, _, err = k.SealBatch(big)
	require.True(t, errors.Is(err, ErrTooLarge), "%v", err)
	big.Entries = big.Entries[:MaxBatchEntries/4]
	_, _, err = k.SealBatch(big)
	require.NoError(t, err, "a quarter of the worst case fits: the dispatcher halves a batch until it does")
}

// BatchLen counts what SealBatch wrote, whatever the tenants and keys hold,
// and 1 for a single message or a body that only claims to be a batch.
func TestBatchLen(t *testing.T) {
	t.Parallel()
	k, err := ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)
	for _, n := range []int{1, 2, 50, PreviousMaxBatchEntries, PreviousMaxBatchEntries + 1, MaxBatchEntries} {
		b := testBatch(n)
		b.Entries[0].Tenant = `{"id":1}` // escaped in the body: not an entry
		body, _, err := k.SealBatch(b)
		require.NoError(t, err)
		require.Equal(t, n, BatchLen(body), "a batch of %d", n)
	}
	one := testBatch(1)
	single, _, err := k.Seal(one.Envelope(0))
	require.NoError(t, err)
	require.Equal(t, 1, BatchLen(single))
	require.Equal(t, 1, BatchLen([]byte(`{"v":2}`)), "a batch without entries")
	require.Equal(t, MaxBatchEntries, BatchLen([]byte(`{"v":2,"entries":[`+strings.Repeat(`{"id":1},`, 2*MaxBatchEntries)+`]}`)))
}
