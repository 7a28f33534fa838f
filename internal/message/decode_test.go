package message

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

// randomBatch is a batch as a dispatcher could seal it, its strings drawn
// from pieces that json.Marshal writes plainly and pieces it escapes or
// that are not ASCII, its times in several zones and precisions.
func randomBatch(r *rand.Rand, plain bool) Batch {
	pieces := []string{"acme", "tenant-3", "nudge-0123456789abcdef", "", "a b", "x_y.z"}
	if !plain {
		pieces = append(pieces, "<b>", "a&b", `q"uote`, `back\slash`, "tab\t", "zoë", "日本", "\x7f", "\xff")
	}
	str := func() string {
		var b strings.Builder
		for range r.IntN(3) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		return b.String()
	}
	zones := []*time.Location{time.UTC, time.FixedZone("", 2*3600), time.FixedZone("", -(9*3600 + 30*60))}
	when := func() time.Time {
		t := time.Unix(r.Int64N(4e9), 0).In(zones[r.IntN(len(zones))])
		switch r.IntN(3) {
		case 1:
			t = t.Add(time.Duration(r.IntN(1e9)))
		case 2:
			t = t.Add(time.Duration(r.IntN(1000)) * time.Millisecond)
		}
		return t
	}
	ints := []int64{0, 1, 9, 10, 123456789, math.MaxInt64, math.MinInt64, -1}
	b := Batch{Version: BatchVersion, Channel: str(), FirstSeen: when()}
	if r.IntN(10) == 0 {
		b.FirstSeen = time.Time{}
	}
	for range 1 + r.IntN(MaxBatchEntries) {
		b.Entries = append(b.Entries, Entry{ReminderID: ints[r.IntN(len(ints))] + r.Int64N(3), Fence: r.Int64N(1 << 40),
			IdempotencyKey: str(), Tenant: str(), Deadline: when(), Attempt: int(ints[r.IntN(len(ints))])})
	}
	return b
}

// Whatever decodeBatch reads, decodeStrict reads to the same Batch; and it
// reads every batch a dispatcher seals with plain strings (so the fast path
// is the one taken), whatever its ids, times and attempts.
func TestDecodeBatchMatchesDecodeStrict(t *testing.T) {
	t.Parallel()
	k, err := ParseKeys(fuzzKeys)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(18, 3))
	for i := range 3000 {
		plain := i%2 == 0
		body, _, err := k.SealBatch(randomBatch(r, plain))
		if err != nil {
			t.Fatal(err)
		}
		var fast, strict Batch
		ok := decodeBatch(body, &fast)
		if plain && !ok {
			t.Fatalf("a sealed batch of plain strings was left to decodeStrict: %s", body)
		}
		if err := decodeStrict(body, &strict); err != nil {
			t.Fatal(err)
		}
		if ok && !reflect.DeepEqual(fast, strict) {
			t.Fatalf("decodeBatch read %s\nas %+v\ndecodeStrict as %+v", body, fast, strict)
		}
	}
}

// What decodeBatch must leave to decodeStrict: bodies of another shape,
// which decodeStrict reads differently or refuses.
func TestDecodeBatchLeavesOtherShapes(t *testing.T) {
	t.Parallel()
	const entry = `{"id":1,"fence":2,"key":"","tenant":"t","deadline":"2026-01-02T03:04:05Z"}`
	head := `{"v":2,"channel":"sms","first_seen":"2026-01-01T00:00:00Z","entries":[`
	for _, body := range []string{
		head + entry + `]} `, // trailing space
		head + entry + `]}x`, // trailing bytes
		head + `]}`,          // no entries
		head + strings.Replace(entry, `"t"`, `"\u0074"`, 1) + `]}`,              // an escape
		head + strings.Replace(entry, `"t"`, `null`, 1) + `]}`,                  // a null
		head + strings.Replace(entry, `:1,`, `:01,`, 1) + `]}`,                  // a leading zero
		head + strings.Replace(entry, `:1,`, `:1.0,`, 1) + `]}`,                 // not an integer
		head + strings.Replace(entry, `:1,`, `:9223372036854775808,`, 1) + `]}`, // past int64
		head + strings.Replace(entry, `"id"`, `"ID"`, 1) + `]}`,                 // encoding/json ignores the case
		head + strings.Replace(entry, `"2026-01-02T03:04:05Z"`, `"2026-01-02 03:04:05Z"`, 1) + `]}`,
		head + entry[:len(entry)-1] + `,"extra":1}]}`,
		strings.Replace(head, `"v":2`, `"v": 2`, 1) + entry + `]}`,
	} {
		var b Batch
		if decodeBatch([]byte(body), &b) {
			t.Errorf("decodeBatch read %s", body)
		}
	}
	var b Batch
	if !decodeBatch([]byte(head+entry+`,`+entry+`]}`), &b) || len(b.Entries) != 2 || b.Entries[1].Tenant != "t" {
		t.Errorf("decodeBatch did not read two plain entries: %+v", b)
	}
}

// FuzzDecodeBatch: whenever decodeBatch reads a body, decodeStrict reads
// it without error to the same Batch.
func FuzzDecodeBatch(f *testing.F) {
	k, err := ParseKeys(fuzzKeys)
	if err != nil {
		f.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	for range 8 {
		body, _, err := k.SealBatch(randomBatch(r, true))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var fast Batch
		if !decodeBatch(body, &fast) {
			return
		}
		var strict Batch
		if err := decodeStrict(body, &strict); err != nil {
			t.Fatalf("decodeBatch read %q, decodeStrict refused it: %v", body, err)
		}
		if !reflect.DeepEqual(fast, strict) {
			t.Fatalf("decodeBatch read %q as %+v, decodeStrict as %+v", body, fast, strict)
		}
	})
}
