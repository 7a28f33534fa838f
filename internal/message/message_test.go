package message

import (
	"encoding/hex"
	"encoding/json"
	"strconv"
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
	return SignForTest(k, body)[HeaderSignature].(string)
}

func TestParseKeysErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ spec, want string }{
		{"", "no signing keys"},
		{"nokey", "want KID:SECRET"},
		{"k1:short", "at least 16 bytes"},
		{"k 1:0123456789abcdef0123", "key id"},
		{"k1:0123456789abcdef0123,k1:0123456789abcdef0123", "listed twice"},
		{"k1@sms:abcd", "64 hex digits"},
		{"k1@sms:" + strings.Repeat("zz", 32), "64 hex digits"},
		{"k1@:" + strings.Repeat("ab", 32), "channel"},
		{"k1@s s:" + strings.Repeat("ab", 32), "channel"},
		{"k1@sms:" + strings.Repeat("ab", 32) + ",k1@sms:" + strings.Repeat("cd", 32), "listed twice"},
		{"k1:0123456789abcdef0123,k1@sms:" + strings.Repeat("ab", 32), "beside its root key"},
		{"k1@sms:" + strings.Repeat("ab", 32) + ",k1:0123456789abcdef0123", "listed twice"},
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

const rootSecret = "0123456789abcdef0123"

// The channel keys follow HMAC-SHA256(secret, "nudge/v1/channel/"+channel),
// checked against openssl:
//
//	echo -n nudge/v1/channel/sms | openssl dgst -sha256 -hmac 0123456789abcdef0123
func TestChannelKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ channel, want string }{
		{"sms", "ac7bc19d1b115f1e532419470717d08c58f2c99c6aff755d0d5a3a60beb27f02"},
		{"email", "846172e748ac041cd8076b74f7c8576356fe1f06a7b1d4835a8b5d55ae3af4dc"},
	} {
		got := hex.EncodeToString(ChannelKey([]byte(rootSecret), tc.channel))
		require.Equal(t, tc.want, got, "channel %s", tc.channel)
	}
	root, err := ParseKeys("k2:fedcba9876543210fedc,k1:" + rootSecret)
	require.NoError(t, err)
	spec, err := root.ChannelSpec("sms")
	require.NoError(t, err)
	require.Equal(t, "k2@sms:"+hex.EncodeToString(ChannelKey([]byte("fedcba9876543210fedc"), "sms"))+
		",k1@sms:ac7bc19d1b115f1e532419470717d08c58f2c99c6aff755d0d5a3a60beb27f02", spec)
	smsOnly, err := ParseKeys(spec)
	require.NoError(t, err)
	require.Equal(t, "k2", smsOnly.ActiveKeyID(), "the same key id signs")
	_, err = smsOnly.ChannelSpec("email")
	require.ErrorIs(t, err, ErrUnknownKey, "a channel keyring cannot derive another channel's keys")
	_, err = root.ChannelSpec("bad channel")
	require.ErrorContains(t, err, "channel")
}

// TestChannelBoundKeys: a message claiming a channel must carry a MAC made
// with that channel's key, so a holder of the SMS key alone can neither seal
// nor forge email work (issue 13, finding 3).
func TestChannelBoundKeys(t *testing.T) {
	t.Parallel()
	root, err := ParseKeys("k1:" + rootSecret)
	require.NoError(t, err)
	keyring := func(channel string) *Keyring {
		spec, err := root.ChannelSpec(channel)
		require.NoError(t, err)
		k, err := ParseKeys(spec)
		require.NoError(t, err)
		return k
	}
	smsKeys, emailKeys := keyring("sms"), keyring("email")
	require.False(t, smsKeys.Root())
	require.True(t, smsKeys.CanSeal("sms"))
	require.False(t, smsKeys.CanSeal("email"))
	require.True(t, root.CanSeal("email"))

	email := Envelope{ReminderID: 7, Fence: 3, Channel: "email"}
	sms := Envelope{ReminderID: 7, Fence: 3, Channel: "sms"}
	emailBody, err := json.Marshal(email)
	require.NoError(t, err)
	// What a compromised SMS worker can make of an email body: a MAC under
	// its own key, with the key id every keyring knows.
	forged := map[string]any{HeaderKeyID: "k1", HeaderSignature: hex.EncodeToString(
		mac(ChannelKey([]byte(rootSecret), "sms"), "k1", emailBody))}
	// A MAC made with the root secret itself: what this package sealed
	// before channel keys, still queued across the upgrade.
	legacy := map[string]any{HeaderKeyID: "k1", HeaderSignature: hex.EncodeToString(mac([]byte(rootSecret), "k1", emailBody))}

	_, _, err = smsKeys.Seal(email)
	require.ErrorIs(t, err, ErrUnknownKey, "an SMS keyring seals email")

	for _, tc := range []struct {
		name    string
		keys    *Keyring
		body    []byte
		headers map[string]any
		want    error // nil: opens
	}{
		{"root opens email sealed by root", root, nil, nil, nil},
		{"email key opens email sealed by root", emailKeys, nil, nil, nil},
		{"sms key refuses email sealed by root", smsKeys, nil, nil, ErrUnknownKey},
		{"root refuses email signed with the sms key", root, emailBody, forged, ErrBadSignature},
		{"email key refuses email signed with the sms key", emailKeys, emailBody, forged, ErrBadSignature},
		{"sms key refuses email signed with the sms key", smsKeys, emailBody, forged, ErrUnknownKey},
		{"root accepts a legacy root MAC", root, emailBody, legacy, nil},
		{"email key refuses a legacy root MAC", emailKeys, emailBody, legacy, ErrBadSignature},
	} {
		body, headers := tc.body, tc.headers
		if body == nil {
			body, headers, err = root.Seal(email)
			require.NoError(t, err)
		}
		got, err := tc.keys.Open(body, headers)
		if tc.want != nil {
			require.ErrorIs(t, err, tc.want, tc.name)
			continue
		}
		require.NoError(t, err, tc.name)
		require.Equal(t, email, got, tc.name)
	}

	// An SMS worker's own retries: sealed with its key, opened by itself and
	// by the root holders (the reconciler, nudgectl), not by the email key.
	body, hdr, err := smsKeys.Seal(sms)
	require.NoError(t, err)
	for _, k := range []*Keyring{smsKeys, root} {
		got, err := k.Open(body, hdr)
		require.NoError(t, err)
		require.Equal(t, sms, got)
	}
	_, err = emailKeys.Open(body, hdr)
	require.ErrorIs(t, err, ErrUnknownKey)
	// Rewriting the channel breaks the MAC even with the root key.
	_, err = root.Open([]byte(strings.Replace(string(body), `"sms"`, `"email"`, 1)), hdr)
	require.ErrorIs(t, err, ErrBadSignature)
}

// The MAC keys Open and Seal derive are cached per key id and channel, only
// once they verified (or sealed) a message, and at most maxCachedKeys of
// them: bodies naming made-up channels neither grow the cache when forged
// nor break anything past the bound.
func TestMACKeyCacheIsBounded(t *testing.T) {
	t.Parallel()
	k, err := ParseKeys("k1:" + rootSecret)
	require.NoError(t, err)
	for i := range 20 {
		body := []byte(`{"id":1,"channel":"forged` + strconv.Itoa(i) + `"}`)
		_, err := k.Open(body, map[string]any{HeaderKeyID: "k1", HeaderSignature: strings.Repeat("ab", 32)})
		require.ErrorIs(t, err, ErrBadSignature)
	}
	require.Zero(t, k.cached.Load(), "a key that verified nothing is not kept")
	for i := range 2 * maxCachedKeys {
		env := Envelope{ReminderID: int64(i + 1), Fence: 1, Channel: "ch" + strconv.Itoa(i)}
		body, hdr, err := k.Seal(env)
		require.NoError(t, err)
		got, err := k.Open(body, hdr)
		require.NoError(t, err)
		require.Equal(t, env, got)
		// The cached key is the derived one: a body signed under another
		// channel's key still fails.
		other := SignForTest(k, []byte(`{"id":1,"channel":"x`+strconv.Itoa(i)+`"}`))
		_, err = k.Open(body, other)
		require.ErrorIs(t, err, ErrBadSignature)
	}
	require.EqualValues(t, maxCachedKeys, k.cached.Load())
}

// A body with anything after its JSON object is malformed, even when signed.
func TestOpenRefusesTrailingData(t *testing.T) {
	t.Parallel()
	k, err := ParseKeys("k1:" + rootSecret)
	require.NoError(t, err)
	body := []byte(`{"id":1,"channel":"sms"} {}`)
	_, err = k.Open(body, map[string]any{HeaderKeyID: "k1",
		HeaderSignature: hex.EncodeToString(mac(ChannelKey([]byte(rootSecret), "sms"), "k1", body))})
	require.ErrorIs(t, err, ErrMalformed)
	body = []byte("{\"id\":1,\"channel\":\"sms\"}\n")
	_, err = k.Open(body, map[string]any{HeaderKeyID: "k1",
		HeaderSignature: hex.EncodeToString(mac(ChannelKey([]byte(rootSecret), "sms"), "k1", body))})
	require.NoError(t, err, "trailing white space is not data")
}
