package intake_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nudgehq/nudge/pkg/intake"
)

// FuzzCheckData: what CheckData accepts is a JSON object PostgreSQL's jsonb
// stores as it is (valid UTF-8, no NUL in a key or string, within the size
// and depth bounds), and what it refuses is refused naming the data field.
func FuzzCheckData(f *testing.F) {
	for _, s := range []string{`{}`, `{"course":"Go 101","n":[1,2,{"x":null}]}`, `{"a":"\u0000"}`, `{"\u0000":1}`,
		`{"a":"\\u0000"}`, `{"a":"\ud83d\ude00"}`, `{"a":"\ud800"}`, `{"a":"\udc00\ud800"}`, `{"a":1e400}`, `{"a":-0.5E-3}`,
		`[1]`, `{"a":1`, ` {"a" : 1 } `, "{\"a\":\"\xff\"}", `{"a":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		verr := intake.CheckData(data)
		if verr != nil {
			if verr.Field != "data" || verr.Reason == "" {
				t.Fatalf("refused without naming data and a reason: %+v", verr)
			}
			return
		}
		if len(data) > intake.MaxDataBytes || !utf8.Valid(data) || !json.Valid(data) {
			t.Fatalf("accepted %q", data)
		}
		var v any
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		if _, ok := v.(map[string]any); !ok {
			t.Fatalf("accepted %T, not an object", v)
		}
		// A NUL, or a U+FFFD the input did not hold: encoding/json's stand-in
		// for an unpaired surrogate, which jsonb refuses.
		written := strings.Contains(string(data), "\uFFFD") || strings.Contains(strings.ToLower(string(data)), `\ufffd`)
		bad := func(s string) bool {
			return strings.ContainsRune(s, 0) || (strings.ContainsRune(s, utf8.RuneError) && !written)
		}
		// depth counts the objects and arrays around v (v included when it is
		// one): a scalar inside the deepest container does not nest further.
		var walk func(v any, depth int)
		walk = func(v any, depth int) {
			switch v.(type) {
			case map[string]any, []any:
				if depth > intake.MaxDataDepth {
					t.Fatalf("accepted data nested %d deep", depth)
				}
			}
			switch x := v.(type) {
			case map[string]any:
				for k, e := range x {
					if bad(k) {
						t.Fatalf("accepted key %q", k)
					}
					walk(e, depth+1)
				}
			case []any:
				for _, e := range x {
					walk(e, depth+1)
				}
			case string:
				if bad(x) {
					t.Fatalf("accepted string %q", x)
				}
			}
		}
		walk(v, 1)
	})
}
