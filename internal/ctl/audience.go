package ctl

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
)

// Limits of an audience file (nudgectl campaign stage). One line (a CSV
// record, or a JSON Lines line) is at most MaxLineBytes, as for schedule -f:
// a longer one is a bad line and the rest are read. A CSV physical line
// over MaxAudiencePhysicalLine ends the read (a CSV reader must hold a
// whole record to find its end). A file is at most MaxAudienceFileBytes and
// campaign.MaxStageRows lines.
const (
	MaxAudienceFileBytes    = 256 << 20
	MaxAudiencePhysicalLine = 4 << 20
	// maxCachedZones bounds the zone names remembered (there are ~600).
	maxCachedZones = 1000
)

// AudienceColumns names the fields of an audience file: the key and the
// recipient are required in every line; date (YYYY-MM-DD) and zone (an
// IANA name) are optional. In a CSV file every other column becomes a
// string of the template's data; a JSON line gives its data as "data".
type AudienceColumns struct {
	Key, Recipient, Date, Zone string
}

// DefaultAudienceColumns are the column names nudgectl campaign stage assumes.
var DefaultAudienceColumns = AudienceColumns{Key: "key", Recipient: "recipient", Date: "date", Zone: "zone"}

// The recipient patterns of nudge_invalid (schema 0001 and 0010), checked
// again when the rows are planned (pkg/intake): a file is told about its bad
// addresses when it is staged, not when a campaign plans it.
var (
	emailPattern = regexp.MustCompile(`^[^@\s<>]+@[^@\s<>]+\.[^@\s<>]+$`)
	phonePattern = regexp.MustCompile(`^\+[1-9][0-9]{6,14}$`)
)

// audienceReader checks audience lines into campaign.StagedRows.
type audienceReader struct {
	cols    AudienceColumns
	channel string
	row     func(campaign.StagedRow) error
	bad     func(campaign.StageError)
	lines   int
	// zones caches LoadZone's answer per name (it reads the zone database).
	zones map[string]error
}

// ReadAudience reads an audience file of format "csv" (a header row, then
// one row per line) or "jsonl", calling row for each good line and bad for
// each bad one, in file order. channel ("email", "sms", "webhook") decides
// what a recipient must look like. The error is for the file as a whole
// (unreadable, over a limit, a CSV header without the key or recipient).
func ReadAudience(r io.Reader, format string, cols AudienceColumns, channel string,
	row func(campaign.StagedRow) error, bad func(campaign.StageError)) error {
	a := &audienceReader{cols: cols, channel: channel, row: row, bad: bad, zones: map[string]error{}}
	switch format {
	case "csv":
		return a.readCSV(r)
	case "jsonl":
		return a.readJSONL(r)
	}
	return fmt.Errorf("format %q: want csv or jsonl", format)
}

// count counts a line against campaign.MaxStageRows.
func (a *audienceReader) count() error {
	a.lines++
	if a.lines > campaign.MaxStageRows {
		return campaign.ErrStageTooLarge
	}
	return nil
}

func (a *audienceReader) readJSONL(r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	n := 0
	for {
		raw, tooLong, err := readLine(br, buf[:0], MaxLineBytes)
		buf = raw[:0]
		if len(raw) > 0 || tooLong {
			n++
			t := bytes.TrimSpace(raw)
			if tooLong || len(t) > 0 {
				if cerr := a.count(); cerr != nil {
					return cerr
				}
			}
			switch {
			case tooLong:
				a.bad(campaign.StageError{Line: n, Field: "line",
					Reason: fmt.Sprintf("is longer than %d bytes, the limit for one line; skipped", MaxLineBytes)})
			case len(t) > 0:
				if rerr := a.jsonLine(n, t); rerr != nil {
					return rerr
				}
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading line %d: %w", n+1, err)
		}
	}
}

func (a *audienceReader) jsonLine(n int, raw []byte) error {
	if !utf8.Valid(raw) {
		a.bad(campaign.StageError{Line: n, Field: "line", Reason: "must be valid UTF-8"})
		return nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		a.bad(campaign.StageError{Line: n, Field: "line", Reason: "must be a JSON object: " + err.Error()})
		return nil
	}
	vals := map[string]string{}
	var names []string
	for k := range obj {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		v := obj[k]
		switch k {
		case a.cols.Key, a.cols.Recipient, a.cols.Date, a.cols.Zone:
			s, reason := jsonScalar(v, k == a.cols.Key)
			if reason != "" {
				a.bad(campaign.StageError{Line: n, Key: vals[a.cols.Key], Field: k, Reason: reason})
				return nil
			}
			vals[k] = s
		case "data":
		default:
			a.bad(campaign.StageError{Line: n, Field: k, Reason: fmt.Sprintf(
				"is not a field of an audience line (want %s, %s, %s, %s, data)", a.cols.Key, a.cols.Recipient, a.cols.Date, a.cols.Zone)})
			return nil
		}
	}
	var data json.RawMessage
	if d := bytes.TrimSpace(obj["data"]); len(d) > 0 && string(d) != "null" {
		if d[0] != '{' {
			a.bad(campaign.StageError{Line: n, Key: vals[a.cols.Key], Field: "data", Reason: "must be a JSON object"})
			return nil
		}
		data = d
	}
	return a.check(n, vals, data)
}

// jsonScalar is a field's value as text: a string, null (empty), or for
// the key an integer too.
func jsonScalar(v json.RawMessage, numberOK bool) (string, string) {
	v = bytes.TrimSpace(v)
	switch {
	case string(v) == "null":
		return "", ""
	case len(v) > 0 && v[0] == '"':
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return "", "must be a string: " + err.Error()
		}
		return s, ""
	case numberOK && len(v) > 0 && strings.Trim(string(v), "-0123456789") == "":
		return string(v), ""
	}
	if numberOK {
		return "", "must be a string or an integer"
	}
	return "", "must be a string"
}

func (a *audienceReader) readCSV(r io.Reader) error {
	g := &lineGuard{r: r, limit: MaxAudiencePhysicalLine, line: 1}
	cr := csv.NewReader(g)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		return fmt.Errorf("line 1: reading the header row: %w", err)
	}
	cols := make([]string, len(header))
	index := map[string]int{}
	for i, h := range header {
		if i == 0 {
			h = strings.TrimPrefix(h, "\uFEFF") // a spreadsheet's byte order mark
		}
		h = strings.TrimSpace(h)
		if _, dup := index[h]; dup {
			return fmt.Errorf("line 1: column %q appears twice in the header", h)
		}
		index[h], cols[i] = i, h
	}
	for _, need := range []string{a.cols.Key, a.cols.Recipient} {
		if _, ok := index[need]; !ok {
			return fmt.Errorf("line 1: the header has no column %q (it has %s; name the columns with --key-column and --recipient-column)",
				need, strings.Join(cols, ", "))
		}
	}
	last := cr.InputOffset()
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		line, _ := cr.FieldPos(0)
		size := cr.InputOffset() - last
		last = cr.InputOffset()
		if g.err != nil {
			return g.err
		}
		if cerr := a.count(); cerr != nil {
			return cerr
		}
		var pe *csv.ParseError
		switch {
		case errors.As(err, &pe):
			a.bad(campaign.StageError{Line: pe.StartLine, Field: "line", Reason: "is not valid CSV: " + pe.Err.Error()})
			continue
		case err != nil:
			return fmt.Errorf("reading line %d: %w", line, err)
		case size > MaxLineBytes:
			a.bad(campaign.StageError{Line: line, Field: "line",
				Reason: fmt.Sprintf("is %d bytes, longer than %d, the limit for one line; skipped", size, MaxLineBytes)})
			continue
		}
		vals := map[string]string{}
		data := map[string]string{}
		for i, v := range rec {
			switch cols[i] {
			case a.cols.Key, a.cols.Recipient, a.cols.Date, a.cols.Zone:
				vals[cols[i]] = v
			default:
				data[cols[i]] = v
			}
		}
		var raw json.RawMessage
		if len(data) > 0 {
			raw, _ = json.Marshal(data) // strings only: cannot fail
		}
		if err := a.check(line, vals, raw); err != nil {
			return err
		}
	}
}

// check turns one line's values into a row, or a bad line naming the field.
func (a *audienceReader) check(n int, vals map[string]string, data json.RawMessage) error {
	key := vals[a.cols.Key]
	bad := func(field, reason string) error {
		if utf8.ValidString(key) && len(key) <= 4*campaign.MaxStageKeyChars {
			a.bad(campaign.StageError{Line: n, Key: key, Field: field, Reason: reason})
		} else {
			a.bad(campaign.StageError{Line: n, Field: field, Reason: reason})
		}
		return nil
	}
	for _, f := range []string{a.cols.Key, a.cols.Recipient, a.cols.Date, a.cols.Zone} {
		if verr := intake.CheckString(f, vals[f]); verr != nil {
			return bad(f, verr.Reason)
		}
	}
	switch {
	case strings.TrimSpace(key) == "":
		return bad(a.cols.Key, "is required")
	case utf8.RuneCountInString(key) > campaign.MaxStageKeyChars:
		return bad(a.cols.Key, fmt.Sprintf("must be at most %d characters", campaign.MaxStageKeyChars))
	}
	recipient := strings.TrimSpace(vals[a.cols.Recipient])
	if reason := checkRecipient(a.channel, recipient); reason != "" {
		return bad(a.cols.Recipient, reason)
	}
	r := campaign.StagedRow{Line: n, Key: key, Recipient: recipient, Data: data}
	if d := strings.TrimSpace(vals[a.cols.Date]); d != "" {
		t, err := time.Parse(time.DateOnly, d)
		if err != nil {
			return bad(a.cols.Date, fmt.Sprintf("must be a date like 2027-01-31, not %q", d))
		}
		r.Date = &t
	}
	if z := strings.TrimSpace(vals[a.cols.Zone]); z != "" {
		if err := a.zone(z); err != nil {
			return bad(a.cols.Zone, "must be an IANA time zone name: "+err.Error())
		}
		r.Zone = &z
	}
	if len(data) > 0 {
		if verr := intake.CheckData(data); verr != nil {
			return bad("data", verr.Reason)
		}
	}
	return a.row(r)
}

// zone checks a zone name, remembering the answer for up to maxCachedZones names.
func (a *audienceReader) zone(name string) error {
	if err, ok := a.zones[name]; ok {
		return err
	}
	_, err := localtime.LoadZone(name)
	if len(a.zones) < maxCachedZones {
		a.zones[name] = err
	}
	return err
}

// checkRecipient says what is wrong with a recipient of channel, or "".
func checkRecipient(channel, r string) string {
	switch {
	case r == "":
		return "is required"
	case utf8.RuneCountInString(r) > intake.MaxRecipientChars:
		return fmt.Sprintf("must be at most %d characters", intake.MaxRecipientChars)
	case channel == "email" && !emailPattern.MatchString(r):
		return "must be an email address like name@example.com"
	case channel == "sms" && !phonePattern.MatchString(r):
		return "must be an E.164 phone number like +14155550100"
	case channel == "webhook" && !strings.HasPrefix(r, "https://") && !strings.HasPrefix(r, "http://"):
		return "must be an http or https URL"
	}
	return ""
}

// lineGuard passes r through, failing once a physical line is longer than
// limit bytes (the CSV reader would hold it whole).
type lineGuard struct {
	r     io.Reader
	limit int
	run   int // bytes since the last newline
	line  int
	err   error
}

func (g *lineGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	n, err := g.r.Read(p)
	for _, c := range p[:n] {
		if c == '\n' {
			g.run = 0
			g.line++
			continue
		}
		g.run++
		if g.run > g.limit {
			g.err = fmt.Errorf("line %d is longer than %d bytes: not an audience file", g.line, g.limit)
			return 0, g.err
		}
	}
	return n, err
}
