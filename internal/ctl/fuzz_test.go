package ctl

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nudgehq/nudge/pkg/intake"
)

// FuzzParseLine: any line either parses into a request PostgreSQL can
// hold (valid UTF-8, no NUL, data intake accepts) or is refused with an
// error that names the line.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		`{"tenant":"acme","key":"k1","channel":"email","recipient":"a@example.com","template":"course-expiry",` +
			`"data":{"course":"Go 101"},"due_at":"2026-08-12T09:00:00Z","deadline":"2026-08-12T23:59:00Z"}`,
		`{"key":"a\u0000b"}`, "{\"key\":\"caf\xe9\"}", `{"data":{"a":"\ud800"}}`, `{"data":[1]}`, `{"data":null}`,
		`{"due_at":"tomorrow"}`, `{"colour":"red"}`, `[1]`, `{} {}`, `{}}`, `"x"`, `{"tenant":5}`, `{"data":{"a":1e999999}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		req, lerr := ParseLine(9, raw)
		if lerr != nil {
			if lerr.Line != 9 || lerr.Reason == "" || !strings.HasPrefix(lerr.Error(), "line 9: ") {
				t.Fatalf("an error that does not name the line and a reason: %#v", lerr)
			}
			return
		}
		for name, v := range map[string]string{"tenant": req.Tenant, "key": req.Key, "channel": string(req.Channel),
			"recipient": req.Recipient, "template": req.Template} {
			if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
				t.Fatalf("accepted %s %q, which PostgreSQL text cannot hold", name, v)
			}
		}
		if req.Data != nil {
			data, ok := req.Data.(json.RawMessage)
			if !ok {
				t.Fatalf("data of type %T", req.Data)
			}
			if verr := intake.CheckData(data); verr != nil {
				t.Fatalf("accepted data intake refuses: %v", verr)
			}
		}
	})
}

// FuzzReadLine splits any input into lines with a small limit: every line
// comes back whole and in order when it fits, is reported too long (and
// holds nothing) when it does not, and nothing is read twice or lost.
func FuzzReadLine(f *testing.F) {
	for _, s := range []string{"", "a\nb\n", "a\r\nbb\r\n", "abcdefgh\nab", "\n\n\n", "abc\r", strings.Repeat("x", 40) + "\nok\n"} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, in []byte, limit uint8) {
		l := int(limit%32) + 1
		br := bufio.NewReaderSize(bytes.NewReader(in), 16) // smaller than most lines: exercises ErrBufferFull
		want := bytes.SplitAfter(in, []byte("\n"))
		if len(want[len(want)-1]) == 0 {
			want = want[:len(want)-1]
		}
		for i := 0; ; i++ {
			line, tooLong, err := readLine(br, nil, l)
			if len(line) == 0 && !tooLong {
				if i != len(want) {
					t.Fatalf("stopped after %d lines of %d", i, len(want))
				}
				return
			}
			if i >= len(want) {
				t.Fatalf("line %d beyond the %d in the input", i+1, len(want))
			}
			content := bytes.TrimSuffix(bytes.TrimSuffix(want[i], []byte("\n")), []byte("\r"))
			if !bytes.HasSuffix(want[i], []byte("\n")) {
				content = want[i] // no line ending at EOF: a trailing '\r' is content
			}
			switch {
			case tooLong != (len(content) > l):
				t.Fatalf("line %d of %d bytes, limit %d: tooLong %v", i+1, len(content), l, tooLong)
			case tooLong && len(line) > 0:
				t.Fatalf("a too-long line returned %d bytes", len(line))
			case !tooLong && !bytes.Equal(line, want[i]):
				t.Fatalf("line %d: got %q, want %q", i+1, line, want[i])
			}
			if err != nil && i != len(want)-1 {
				t.Fatalf("error %v before the last line", err)
			}
		}
	})
}

// FuzzReadLines: line numbers are those of the input, each line is either
// good or bad once, and blank lines are neither.
func FuzzReadLines(f *testing.F) {
	f.Add([]byte("{\"key\":\"a\"}\n\n{oops\n{\"key\":\"b\"}"))
	f.Add([]byte("\r\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var seen []int
		record := func(n int) {
			if len(seen) > 0 && n <= seen[len(seen)-1] {
				t.Fatalf("line %d after line %d", n, seen[len(seen)-1])
			}
			seen = append(seen, n)
		}
		n, err := ReadLines(bytes.NewReader(in), func(p ParsedLine) error { record(p.Line); return nil },
			func(e *LineError) { record(e.Line) })
		if err != nil {
			t.Fatal(err)
		}
		lines := bytes.Count(in, []byte("\n"))
		if len(in) > 0 && in[len(in)-1] != '\n' {
			lines++
		}
		if n != lines {
			t.Fatalf("%d lines counted, the input has %d", n, lines)
		}
		if len(seen) > 0 && seen[len(seen)-1] > n {
			t.Fatalf("line %d of %d", seen[len(seen)-1], n)
		}
	})
}
