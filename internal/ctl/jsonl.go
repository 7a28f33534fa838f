// Package ctl implements nudgectl, the command line for operators and for
// bulk intake. Its intake goes through pkg/intake like every other path, so
// a file of reminders is validated exactly as a web tier's SQL call would be.
package ctl

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// LineError is a rejected line of a JSON Lines file.
type LineError struct {
	Line   int
	Field  string
	Reason string
}

func (e *LineError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("line %d: %s", e.Line, e.Reason)
	}
	return fmt.Sprintf("line %d: field %q %s", e.Line, e.Field, e.Reason)
}

// jsonLine is one line as written; times stay strings so a bad one is
// reported with its field.
type jsonLine struct {
	Tenant    string          `json:"tenant"`
	Key       string          `json:"key"`
	Channel   string          `json:"channel"`
	Recipient string          `json:"recipient"`
	Template  string          `json:"template"`
	Data      json.RawMessage `json:"data"`
	DueAt     string          `json:"due_at"`
	Deadline  string          `json:"deadline"`
	// The recipient-local fields (docs/local-time.md).
	TZ            string  `json:"tz"`
	DueLocal      string  `json:"due_local"`
	DeadlineLocal string  `json:"deadline_local"`
	Window        *string `json:"window"`
}

// ParsedLine is a line that parsed, with its line number.
type ParsedLine struct {
	Line int
	Req  intake.Request
}

// MaxLineBytes bounds one line of a JSON Lines file: room for the largest
// data intake accepts (intake.MaxDataBytes) and every other field at its
// bound, escaped. A longer line is reported and skipped, unread, and the
// lines after it are processed: a reader never holds more than this.
const MaxLineBytes = intake.MaxDataBytes + 64<<10

// ParseLine decodes one JSON object into a request, or says which field is wrong.
func ParseLine(n int, raw []byte) (intake.Request, *LineError) {
	if !utf8.Valid(raw) {
		// Checked before decoding, which would replace each invalid byte
		// with U+FFFD in silence.
		return intake.Request{}, &LineError{Line: n, Field: invalidUTF8Field(raw), Reason: "must be valid UTF-8"}
	}
	var l jsonLine
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Field == "":
			// The line itself is an array, string, number or bool.
			return intake.Request{}, &LineError{Line: n, Reason: "is not a JSON object: it is a JSON " + te.Value}
		case errors.As(err, &te):
			return intake.Request{}, &LineError{Line: n, Field: te.Field, Reason: "must be a JSON " + jsonKind(te.Type.Kind().String())}
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return intake.Request{}, &LineError{Line: n, Field: f, Reason: "is not a known field (want tenant, key, channel, recipient, template, data, due_at, deadline, tz, due_local, deadline_local, window)"}
		default:
			return intake.Request{}, &LineError{Line: n, Reason: "is not a JSON object: " + err.Error()}
		}
	}
	// Not dec.More(): it reports false before a stray '}' or ']', which would
	// then be ignored.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return intake.Request{}, &LineError{Line: n, Reason: "holds more than one JSON value"}
	}
	req := intake.Request{
		Tenant: l.Tenant, Key: l.Key, Channel: reminder.Channel(l.Channel), Recipient: l.Recipient,
		Template: l.Template, TZ: l.TZ, DueLocal: l.DueLocal, DeadlineLocal: l.DeadlineLocal,
	}
	for _, f := range [...]struct{ name, value string }{{"tenant", l.Tenant}, {"key", l.Key},
		{"channel", l.Channel}, {"recipient", l.Recipient}, {"template", l.Template}, {"tz", l.TZ},
		{"due_local", l.DueLocal}, {"deadline_local", l.DeadlineLocal}} {
		if verr := intake.CheckString(f.name, f.value); verr != nil { // a \u0000 escape
			return req, &LineError{Line: n, Field: verr.Field, Reason: verr.Reason}
		}
	}
	if len(l.Data) > 0 && !bytes.Equal(l.Data, []byte("null")) { // null means absent, as for every field
		if verr := intake.CheckData(l.Data); verr != nil {
			return req, &LineError{Line: n, Field: verr.Field, Reason: verr.Reason}
		}
		req.Data = l.Data
	}
	if l.Window != nil {
		w, werr := localtime.ParseWindow(*l.Window)
		if werr != nil {
			return req, &LineError{Line: n, Field: "window", Reason: "must be a send window like \"08:00-21:00\", \"mon-fri 09:00-17:00\" or \"any\": " + werr.Error()}
		}
		req.Window = &w
	}
	var err *LineError
	if req.DueAt, err = parseTime(n, "due_at", l.DueAt); err != nil {
		return req, err
	}
	if req.Deadline, err = parseTime(n, "deadline", l.Deadline); err != nil {
		return req, err
	}
	return req, nil
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "string"
	case "slice":
		return "object" // json.RawMessage: data
	}
	return k
}

func parseTime(n int, field, v string) (time.Time, *LineError) {
	if v == "" {
		return time.Time{}, nil // the intake validation reports it as required
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, &LineError{Line: n, Field: field, Reason: fmt.Sprintf("must be an RFC 3339 time like 2026-08-12T09:00:00Z, got %q", v)}
	}
	return t, nil
}

// invalidUTF8Field names the field of raw whose value holds invalid UTF-8,
// or "" when it is a field name or raw is not a JSON object.
func invalidUTF8Field(raw []byte) string {
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil {
		return ""
	}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if !utf8.Valid(fields[k]) {
			return k
		}
	}
	return ""
}

// ReadLines reads JSON Lines from r, calling good for each parsed line and
// bad for each line that did not parse or is longer than MaxLineBytes.
// Blank lines are skipped.
func ReadLines(r io.Reader, good func(ParsedLine) error, bad func(*LineError)) (int, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	n := 0
	for {
		raw, tooLong, err := readLine(br, buf[:0], MaxLineBytes)
		buf = raw[:0] // reused: at most MaxLineBytes and one read buffer
		if len(raw) > 0 || tooLong {
			n++
			if tooLong {
				bad(&LineError{Line: n, Reason: fmt.Sprintf("is longer than %d bytes, the limit for one line; skipped", MaxLineBytes)})
			} else if t := bytes.TrimSpace(raw); len(t) > 0 {
				req, lerr := ParseLine(n, t)
				if lerr != nil {
					bad(lerr)
				} else if gerr := good(ParsedLine{Line: n, Req: req}); gerr != nil {
					return n, gerr
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("reading line %d: %w", n+1, err)
		}
	}
}

// readLine appends the next line of br (with its line ending) to buf. A
// line longer than limit bytes, not counting its "\n" or "\r\n", is read to
// its end and dropped: tooLong, and no bytes.
func readLine(br *bufio.Reader, buf []byte, limit int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			buf = append(buf, chunk...)
			n := len(buf)
			if err == nil { // the chunk ends the line
				n--
				if n > 0 && buf[n-1] == '\r' {
					n--
				}
			} else if errors.Is(err, bufio.ErrBufferFull) {
				n-- // its last byte may be the '\r' of a "\r\n"
			}
			if n > limit {
				tooLong, buf = true, buf[:0]
			}
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return buf, tooLong, err
		}
	}
}
