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

// acceptanceSeeds are answers of the shapes providers send, and near misses.
var acceptanceSeeds = []string{
	`{"id":"m-1","status":"accepted"}` + "\n", `{"id":"m-1","status":"accepted","duplicate":true}`, `{}`, ` { } `,
	`{"ID":"a","Id":"b"}`, `{"id":"a","id":null}`, `{"id":true}`, `{"id":"a\"b"}`, `{"id":"\u00e9"}`, `{"id":"é"}`,
	`{"id":"a\xffb"}`, `{"id":"a",}`, `{"id":"a"} x`, `{"id":1}`, `{"status":"x","id":"q"}`, `{"ıd":"a"}`,
	`{"id":"a" , "n":null ,"t":false}`, `["id"]`, `{"id":"tab	here"}`, `{"id"  :  "x"}`, `{"id":"x"`, `nul`, ``,
}

// FuzzAcceptedID: whenever acceptedID reads a body, encoding/json reads the
// same id from it, without error.
func FuzzAcceptedID(f *testing.F) {
	for _, s := range acceptanceSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		id, ok := acceptedID(body)
		if !ok {
			return
		}
		var a acceptance
		require.NoError(t, json.Unmarshal(body, &a), "%q", body)
		require.Equal(t, a.ID, id, "%q", body)
	})
}

// TestAcceptedIDReadsPlainAnswers: the answers the fake provider gives (and
// the plain shapes around them) are read without encoding/json, and agree
// with it.
func TestAcceptedIDReadsPlainAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body string
		id   string
	}{
		{`{"id":"m-1","status":"accepted"}` + "\n", "m-1"},
		{`{"id":"m-1","status":"accepted","duplicate":true}`, "m-1"},
		{` {"status" : "queued", "ID":"a", "Id": "b" , "x":null} `, "b"},
		{`{"id":"é 日本"}`, "é 日本"},
		{`{}`, ""},
	} {
		id, ok := acceptedID([]byte(tc.body))
		require.True(t, ok, "%q is read", tc.body)
		require.Equal(t, tc.id, id, "%q", tc.body)
		var a acceptance
		require.NoError(t, json.Unmarshal([]byte(tc.body), &a))
		require.Equal(t, a.ID, id, "%q agrees with encoding/json", tc.body)
	}
	for _, body := range []string{`{"id":"a","id":null}`, `{"id":true}`, `{"id":"a\"b"}`, `{"id":"a\xffb"}`,
		`{"id":"a",}`, `{"id":"a"} x`, `{"id":1}`, `{"ıd":"a"}`, `{"id":"x"`, ``} {
		_, ok := acceptedID([]byte(body))
		require.False(t, ok, "%q is left to encoding/json", body)
	}
}

// BenchmarkAcceptance reads the id of the fake provider's acceptance, as
// interpret did (encoding/json) and does (acceptedID).
//
//	go test ./internal/sms -run '^$' -bench '^BenchmarkAcceptance$' -benchmem -count 6
func BenchmarkAcceptance(b *testing.B) {
	body := []byte(`{"id":"01JDZ4Q6W3K8M2N5P7R9T1V3X5","status":"accepted"}` + "\n")
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var a acceptance
			if err := json.Unmarshal(body, &a); err != nil || a.ID == "" {
				b.Fatal(err)
			}
		}
	})
	b.Run("acceptedID", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if id, ok := acceptedID(body); !ok || id == "" {
				b.Fatal(id)
			}
		}
	})
}
