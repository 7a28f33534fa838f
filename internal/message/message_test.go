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
