package sms

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// marshalRequest is the body as Send wrote it before appendRequest: the
// JSON encoding of this struct.
func marshalRequest(t *testing.T, to, body string, reference int64, tenant, from string) []byte {
	t.Helper()
	b, err := json.Marshal(struct {
		To        string `json:"to"`
		Body      string `json:"body"`
		Reference string `json:"reference"`
		Tenant    string `json:"tenant"`
		From      string `json:"from,omitempty"`
	}{to, body, strconv.FormatInt(reference, 10), tenant, from})
	require.NoError(t, err)
	return b
}

// pieces are what the strings of a body are made of: every byte class
// encoding/json treats apart (control bytes, the short escapes, quotes,
// HTML's < > &, DEL, multi-byte runes, U+2028/2029, invalid UTF-8).
var pieces = []string{"", "a", "Ada", " ", "\x00", "\x01", "\x1f", "\b", "\f", "\n", "\r", "\t", `"`, `\`, "<", ">", "&",
	"\x7f", "é", "日本", "😀", "\u2028", "\u2029", "\u2027", "\xff", "\xe2\x80", "\xed\xa0\x80", "+1 (415) 555", "'", "/"}

func randomString(rng *rand.Rand) string {
	var b strings.Builder
	for range rng.IntN(8) {
		b.WriteString(pieces[rng.IntN(len(pieces))])
	}
	return b.String()
}

// TestAppendRequestMatchesMarshal: the body Send writes is byte for byte
// what encoding/json wrote, whatever the strings hold (a provider that
// checks a signature or compares bodies sees no change).
func TestAppendRequestMatchesMarshal(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	refs := []int64{0, 1, 42, -7, 1 << 62, -1 << 63}
	for i := range 20000 {
		to, body, tenant, from := randomString(rng), randomString(rng), randomString(rng), randomString(rng)
		ref := refs[i%len(refs)]
		want := marshalRequest(t, to, body, ref, tenant, from)
		got := appendRequest(nil, to, body, ref, tenant, from)
		require.Equal(t, string(want), string(got), "%q %q %d %q %q", to, body, ref, tenant, from)
	}
}

// FuzzAppendJSONString: any string is quoted as encoding/json quotes it.
func FuzzAppendJSONString(f *testing.F) {
	for _, p := range pieces {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		require.NoError(t, err)
		require.Equal(t, string(want), string(appendJSONString(nil, s)))
	})
}
