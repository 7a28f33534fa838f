package message

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSealOpenRoundTripAndRotation(t *testing.T) {
	t.Parallel()
	old, err := ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)
	env := Envelope{ReminderID: 7, Fence: 3, IdempotencyKey: "nudge-x", Channel: "email", Tenant: "acme",
		Deadline: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	body, hdr, err := old.Seal(env)
	require.NoError(t, err)

	got, err := old.Open(body, hdr)
	require.NoError(t, err)
	require.Equal(t, env, got)

	// Rotation: k2 signs now, k1 still verifies what was queued under it.
	rotated, err := ParseKeys("k2:fedcba9876543210fedc, k1:0123456789abcdef0123")
	require.NoError(t, err)
	require.Equal(t, "k2", rotated.ActiveKeyID())
	_, err = rotated.Open(body, hdr)
	require.NoError(t, err)
	body2, hdr2, err := rotated.Seal(env)
	require.NoError(t, err)
	require.Equal(t, "k2", hdr2[HeaderKeyID])
	_, err = old.Open(body2, hdr2)
	require.ErrorIs(t, err, ErrUnknownKey)
}

func TestOpenRefusesUnsignedTamperedMalformed(t *testing.T) {
	t.Parallel()
	k, err := ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)
	body, hdr, err := k.Seal(Envelope{ReminderID: 7, Fence: 3, Channel: "sms"})
	require.NoError(t, err)

	_, err = k.Open(body, nil)
	require.ErrorIs(t, err, ErrUnsigned)

	tampered := []byte(strings.Replace(string(body), `"fence":3`, `"fence":4`, 1))
	_, err = k.Open(tampered, hdr)
	require.ErrorIs(t, err, ErrBadSignature)

	forged := map[string]any{HeaderKeyID: "k1", HeaderSignature: "zz"}
	_, err = k.Open(body, forged)
	require.ErrorIs(t, err, ErrBadSignature)

	junk := []byte(`{"id":"seven"}`)
	_, hdrJunk, _ := k.Seal(Envelope{})
	hdrJunk[HeaderSignature] = signHex(k, junk)
	_, err = k.Open(junk, hdrJunk)
	require.ErrorIs(t, err, ErrMalformed)
}

func signHex(k *Keyring, body []byte) string {
	const hexdigits = "0123456789abcdef"
	sum := k.mac(k.active, body)
	out := make([]byte, 0, len(sum)*2)
	for _, b := range sum {
		out = append(out, hexdigits[b>>4], hexdigits[b&15])
	}
	return string(out)
}

func TestParseKeysErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ spec, want string }{
		{"", "no signing keys"},
		{"nokey", "want KID:SECRET"},
		{"k1:short", "at least 16 bytes"},
		{"k 1:0123456789abcdef0123", "key id"},
		{"k1:0123456789abcdef0123,k1:0123456789abcdef0123", "listed twice"},
	} {
		_, err := ParseKeys(tc.spec)
		require.ErrorContains(t, err, tc.want, "spec %q", tc.spec)
	}
}

// Regression (issue 13, finding 1): a worker verified and decoded a body of
// any size (one 26 MB message took an SMS worker from 33 to 136 MB). A body
// over MaxBodyBytes is refused before the HMAC, even with a valid signature,
// and the largest envelope Seal can make fits well within it.
func TestOpenRefusesAnOversizedBodyBeforeVerifying(t *testing.T) {
	t.Parallel()
	k, err := ParseKeys("k1:0123456789abcdef0123")
	require.NoError(t, err)

	huge := make([]byte, MaxBodyBytes+1)
	_, err = k.Open(huge, SignForTest(k, huge))
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = k.Open(huge, nil)
	require.ErrorIs(t, err, ErrTooLarge, "checked before the signature headers")

	largest := Envelope{ReminderID: 1<<63 - 1, Fence: 1<<63 - 1, Attempt: 1<<31 - 1,
		IdempotencyKey: "nudge-" + strings.Repeat("f", 64), Channel: "email",
		Tenant:   strings.Repeat("\U0001F600", 128), // intake.MaxTenantChars of the widest characters
		Deadline: time.Now(), FirstSeen: time.Now(), NotBefore: time.Now()}
	body, hdr, err := k.Seal(largest)
	require.NoError(t, err)
	require.Less(t, len(body), MaxBodyBytes/2)
	got, err := k.Open(body, hdr)
	require.NoError(t, err)
	require.Equal(t, largest.Tenant, got.Tenant)

	_, _, err = k.Seal(Envelope{ReminderID: 1, Channel: "email", Tenant: strings.Repeat("x", MaxBodyBytes)})
	require.ErrorIs(t, err, ErrTooLarge, "Seal never makes a body Open would refuse")
}
