package ctl_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// goodLine is a complete, valid line; tests edit one field of it.
const goodLine = `{"tenant":"acme","key":"k1","channel":"email","recipient":"a@example.com",` +
	`"template":"course-expiry","data":{"course":"Go 101"},"due_at":"2026-08-12T09:00:00Z",` +
	`"deadline":"2026-08-12T23:59:00Z"}`

// withField returns goodLine with field set to the raw JSON value v.
func withField(t *testing.T, field, v string) string {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(goodLine), &m))
	m[field] = json.RawMessage(v)
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return string(b)
}

func TestParseLineGood(t *testing.T) {
	t.Parallel()

	req, lerr := ctl.ParseLine(3, []byte(goodLine))
	require.Nil(t, lerr)
	require.Equal(t, "acme", req.Tenant)
	require.Equal(t, "k1", req.Key)
	require.Equal(t, reminder.Email, req.Channel)
	require.Equal(t, "a@example.com", req.Recipient)
	require.Equal(t, "course-expiry", req.Template)
	require.JSONEq(t, `{"course":"Go 101"}`, string(req.Data.(json.RawMessage)))
	require.True(t, req.DueAt.Equal(time.Date(2026, 8, 12, 9, 0, 0, 0, time.UTC)))
	require.True(t, req.Deadline.Equal(time.Date(2026, 8, 12, 23, 59, 0, 0, time.UTC)))

	// Offsets and fractional seconds are RFC 3339 too.
	req, lerr = ctl.ParseLine(1, []byte(withField(t, "due_at", `"2026-08-12T11:00:00.123456789+02:00"`)))
	require.Nil(t, lerr)
	require.True(t, req.DueAt.Equal(time.Date(2026, 8, 12, 9, 0, 0, 123456789, time.UTC)), "got %s", req.DueAt)

	// Missing fields are not a parse error: validation reports them as required.
	req, lerr = ctl.ParseLine(1, []byte(`{"tenant":"acme"}`))
	require.Nil(t, lerr)
	require.Nil(t, req.Data)
	require.True(t, req.DueAt.IsZero())

	// null means absent, for data as for every other field (intake: nil Data means {}).
	req, lerr = ctl.ParseLine(1, []byte(withField(t, "data", `null`)))
	require.Nil(t, lerr)
	require.Nil(t, req.Data)
	req, lerr = ctl.ParseLine(1, []byte(withField(t, "tenant", `null`)))
	require.Nil(t, lerr)
	require.Empty(t, req.Tenant)
}

func TestParseLineErrors(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name   string
		line   string
		field  string // "" when the error is about the whole line
		reason string // a substring of the reason
	}{
		// Every field's type error names the field.
		{"tenant number", withField(t, "tenant", `5`), "tenant", "must be a JSON string"},
		{"key bool", withField(t, "key", `true`), "key", "must be a JSON string"},
		{"channel object", withField(t, "channel", `{"a":1}`), "channel", "must be a JSON string"},
		{"recipient array", withField(t, "recipient", `["a@example.com"]`), "recipient", "must be a JSON string"},
		{"template number", withField(t, "template", `1.5`), "template", "must be a JSON string"},
		{"due_at number", withField(t, "due_at", `1786525200`), "due_at", "must be a JSON string"},
		{"deadline bool", withField(t, "deadline", `false`), "deadline", "must be a JSON string"},
		{"data array", withField(t, "data", `[1,2]`), "data", "must be a JSON object"},
		{"data string", withField(t, "data", `"{}"`), "data", "must be a JSON object"},
		{"data number", withField(t, "data", `7`), "data", "must be a JSON object"},

		{"unknown field", withField(t, "colour", `"red"`), "colour", "is not a known field"},

		{"bad due_at", withField(t, "due_at", `"tomorrow"`), "due_at", `RFC 3339 time like 2026-08-12T09:00:00Z, got "tomorrow"`},
		{"due_at without zone", withField(t, "due_at", `"2026-08-12T09:00:00"`), "due_at", `got "2026-08-12T09:00:00"`},
		{"bad deadline", withField(t, "deadline", `"2026-08-12 23:59"`), "deadline", `must be an RFC 3339 time like 2026-08-12T09:00:00Z, got "2026-08-12 23:59"`},

		{"not JSON", `tenant=acme`, "", "is not a JSON object"},
		{"truncated", `{"tenant":"acme"`, "", "is not a JSON object"},
		{"array line", `[1,2]`, "", "is not a JSON object: it is a JSON array"},
		{"string line", `"acme"`, "", "is not a JSON object"},
		{"number line", `42`, "", "is not a JSON object"},
		{"two objects", goodLine + ` {}`, "", "holds more than one JSON value"},
		{"trailing brace", goodLine + `}`, "", "holds more than one JSON value"},
		{"trailing bracket", goodLine + `]`, "", "holds more than one JSON value"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, lerr := ctl.ParseLine(7, []byte(tc.line))
			require.NotNil(t, lerr, "line %s", tc.line)
			require.Equal(t, 7, lerr.Line)
			require.Equal(t, tc.field, lerr.Field, "reason: %s", lerr.Reason)
			require.Contains(t, lerr.Reason, tc.reason)
			if tc.field == "" {
				require.True(t, strings.HasPrefix(lerr.Error(), "line 7: "), lerr.Error())
			} else {
				require.True(t, strings.HasPrefix(lerr.Error(), fmt.Sprintf("line 7: field %q ", tc.field)), lerr.Error())
			}
		})
	}
}

func TestLineErrorMessage(t *testing.T) {
	t.Parallel()
	require.Equal(t, `line 4: field "tenant" must be a JSON string`,
		(&ctl.LineError{Line: 4, Field: "tenant", Reason: "must be a JSON string"}).Error())
	require.Equal(t, `line 9: holds more than one JSON value`,
		(&ctl.LineError{Line: 9, Reason: "holds more than one JSON value"}).Error())
}

type readResult struct {
	n    int
	err  error
	good []ctl.ParsedLine
	bad  []*ctl.LineError
}

func readAll(r io.Reader) readResult {
	var res readResult
	res.n, res.err = ctl.ReadLines(r, func(p ctl.ParsedLine) error {
		res.good = append(res.good, p)
		return nil
	}, func(e *ctl.LineError) { res.bad = append(res.bad, e) })
	return res
}

func TestReadLines(t *testing.T) {
	t.Parallel()

	key := func(k string) string { return withField(t, "key", `"`+k+`"`) }
	cases := []struct {
		name      string
		in        string
		lines     int
		goodLines []int
		goodKeys  []string
		badLines  []int
	}{
		{"empty", "", 0, nil, nil, nil},
		{"one line without newline", key("a"), 1, []int{1}, []string{"a"}, nil},
		{"one line with newline", key("a") + "\n", 1, []int{1}, []string{"a"}, nil},
		{
			name:      "blank lines are skipped but counted",
			in:        "\n" + key("a") + "\n\n   \n\t\n" + key("b") + "\n\n",
			lines:     7,
			goodLines: []int{2, 6}, goodKeys: []string{"a", "b"},
		},
		{
			name:      "CRLF and surrounding spaces",
			in:        key("a") + "\r\n\r\n  " + key("b") + "  \r\n",
			lines:     3,
			goodLines: []int{1, 3}, goodKeys: []string{"a", "b"},
		},
		{
			name:      "bad lines keep their numbers after blank lines",
			in:        key("a") + "\n\n{oops\n\n\n" + key("b") + "\n" + withField(t, "due_at", `"soon"`) + "\n" + key("c"),
			lines:     8,
			goodLines: []int{1, 6, 8}, goodKeys: []string{"a", "b", "c"},
			badLines: []int{3, 7},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := readAll(strings.NewReader(tc.in))
			require.NoError(t, res.err)
			require.Equal(t, tc.lines, res.n, "lines read")
			var gotLines []int
			var gotKeys []string
			for _, p := range res.good {
				gotLines = append(gotLines, p.Line)
				gotKeys = append(gotKeys, p.Req.Key)
			}
			require.Equal(t, tc.goodLines, gotLines, "good line numbers")
			require.Equal(t, tc.goodKeys, gotKeys)
			var badLines []int
			for _, e := range res.bad {
				badLines = append(badLines, e.Line)
			}
			require.Equal(t, tc.badLines, badLines, "bad line numbers")
		})
	}
}

// bufio.Scanner stops at 64 KiB a token; a big data object must still parse,
// including one larger than ReadLines' own read buffer.
func TestReadLinesLongLines(t *testing.T) {
	t.Parallel()

	for _, size := range []int{60 << 10, intake.MaxDataBytes - len(`{"blob":""}`)} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			t.Parallel()
			blob := strings.Repeat("x", size)
			long := withField(t, "data", `{"blob":"`+blob+`"}`)
			require.Greater(t, len(long), size)
			in := withField(t, "key", `"before"`) + "\n" + long + "\n\n" + withField(t, "key", `"after"`) + "\n"

			res := readAll(strings.NewReader(in))
			require.NoError(t, res.err)
			require.Empty(t, res.bad)
			require.Equal(t, 4, res.n)
			require.Len(t, res.good, 3)
			require.Equal(t, []int{1, 2, 4}, []int{res.good[0].Line, res.good[1].Line, res.good[2].Line})
			var data struct{ Blob string }
			require.NoError(t, json.Unmarshal(res.good[1].Req.Data.(json.RawMessage), &data))
			require.Len(t, data.Blob, size)
			require.Equal(t, "after", res.good[2].Req.Key)
		})
	}
}

// Regression (issue 13, finding 1): a 50 MiB line was read whole (nudgectl
// at 404 MB) and accepted. A line longer than MaxLineBytes is now reported
// with its number and skipped without being held, and the next lines are
// read; a line of exactly MaxLineBytes (line ending aside) is read.
func TestReadLinesBoundsALine(t *testing.T) {
	t.Parallel()

	// pad builds a line of exactly n bytes that parses (its key is too long
	// for intake, which ReadLines leaves to intake).
	pad := func(n int) string { return `{"key":"` + strings.Repeat("k", n-len(`{"key":""}`)) + `"}` }
	for _, ending := range []string{"\n", "\r\n", ""} {
		atLimit, overLimit := pad(ctl.MaxLineBytes), pad(ctl.MaxLineBytes+1)
		require.Len(t, atLimit, ctl.MaxLineBytes)
		huge := `{"key":"` + strings.Repeat("x", 50<<20) + `"}`
		for _, tc := range []struct {
			line string
			ok   bool
		}{{atLimit, true}, {overLimit, false}, {huge, false}} {
			in := withField(t, "key", `"before"`) + "\n" + tc.line + ending
			if ending != "" {
				in += withField(t, "key", `"after"`) + "\n"
			}
			res := readAll(strings.NewReader(in))
			require.NoError(t, res.err)
			if tc.ok {
				require.Empty(t, res.bad, "a line of exactly MaxLineBytes, ending %q", ending)
				continue
			}
			require.Len(t, res.bad, 1, "ending %q, %d bytes", ending, len(tc.line))
			require.Equal(t, fmt.Sprintf("line 2: is longer than %d bytes, the limit for one line; skipped", ctl.MaxLineBytes),
				res.bad[0].Error())
			if ending != "" {
				require.Len(t, res.good, 2, "the line after the long one is read")
				require.Equal(t, "after", res.good[1].Req.Key)
				require.Equal(t, 3, res.good[1].Line)
			}
		}
	}
}

// Regression (issue 13, finding 6): invalid UTF-8 in a key was replaced with
// U+FFFD in silence, and a \u0000 escape passed to PostgreSQL, which failed
// the whole batch. Each is now refused for its line, naming the field.
func TestParseLineRefusesNulAndInvalidUTF8(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ line, field, reason string }{
		{withField(t, "key", "\"caf\xe9\""), "key", "must be valid UTF-8"},
		{withField(t, "recipient", "\"\xff@example.com\""), "recipient", "must be valid UTF-8"},
		{withField(t, "data", "{\"a\":\"\xc3\"}"), "data", "must be valid UTF-8"},
		{withField(t, "key", `"a\u0000b"`), "key", "NUL"},
		{withField(t, "tenant", `"\u0000"`), "tenant", "NUL"},
		{withField(t, "template", `"t\u0000"`), "template", "NUL"},
		{withField(t, "data", `{"a":"\u0000"}`), "data", "NUL"},
		{withField(t, "data", `{"\u0000":1}`), "data", "NUL"},
		{withField(t, "data", `{"a":"\udfff"}`), "data", "surrogate"},
		{withField(t, "data", `{"a":1e999999}`), "data", "digits"},
	} {
		_, lerr := ctl.ParseLine(4, []byte(tc.line))
		require.NotNil(t, lerr, tc.line)
		require.Equal(t, 4, lerr.Line)
		require.Equal(t, tc.field, lerr.Field, tc.line)
		require.Contains(t, lerr.Reason, tc.reason, tc.line)
	}
}

func TestReadLinesStopsOnCallbackError(t *testing.T) {
	t.Parallel()

	boom := errors.New("boom")
	in := withField(t, "key", `"a"`) + "\n\n" + withField(t, "key", `"b"`) + "\n" + withField(t, "key", `"c"`) + "\n"
	var seen []int
	n, err := ctl.ReadLines(strings.NewReader(in), func(p ctl.ParsedLine) error {
		seen = append(seen, p.Line)
		if p.Line == 3 {
			return boom
		}
		return nil
	}, func(*ctl.LineError) { t.Fatal("no bad lines expected") })
	require.ErrorIs(t, err, boom)
	require.Equal(t, 3, n)
	require.Equal(t, []int{1, 3}, seen)
}

type failingReader struct {
	data string
	err  error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.data == "" {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestReadLinesReportsReadErrors(t *testing.T) {
	t.Parallel()

	broken := errors.New("disk on fire")
	res := readAll(&failingReader{data: withField(t, "key", `"a"`) + "\n\n", err: broken})
	require.ErrorIs(t, res.err, broken)
	require.ErrorContains(t, res.err, "reading line 3")
	require.Len(t, res.good, 1)
}
