package intake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits on what intake accepts. Each is defined here once; the SQL
// validation every path shares, nudge_invalid (schema/migrations
// 0001_reminders.sql and 0010_input_limits.sql), enforces the same numbers,
// and TestLimitsAreTheSameInGoAndSQL fails if the two drift. Lengths in
// characters are Unicode code points, as PostgreSQL's length() counts them.
//
// They bound what one reminder can cost downstream: a worker loads a batch of
// rows and renders each, so the largest row times the batch must fit a
// worker's memory (docs/deploy.md); and they keep input PostgreSQL would
// refuse out of a set-based batch, where one such row would fail all the
// others with it.
const (
	// MaxTenantChars bounds Request.Tenant.
	MaxTenantChars = 128
	// MaxKeyChars bounds Request.Key.
	MaxKeyChars = 512
	// MaxRecipientChars bounds Request.Recipient: 254 is the longest
	// deliverable email address (RFC 5321's 256-octet path less its angle
	// brackets); an E.164 number is at most 16.
	MaxRecipientChars = 254
	// MaxTemplateChars bounds Request.Template.
	MaxTemplateChars = 128
	// MaxDataBytes bounds Request.Data as JSON text: as sent (Go) and as
	// PostgreSQL prints the stored jsonb (SQL), each check on its own side.
	MaxDataBytes = 64 << 10
	// MaxDataDepth bounds how deeply Data's objects and arrays nest.
	// PostgreSQL's JSON parser recurses and fails a whole statement past a
	// few thousand levels; template data needs a handful.
	MaxDataDepth = 64
	// MaxDataNumberDigits bounds a number in Data written out in full (no
	// exponent): PostgreSQL stores JSON numbers exactly, so 1e131071 is
	// 131,072 digits to every reader of the row, and 1e131072 fails the
	// whole statement. Every float64 written out in full fits.
	MaxDataNumberDigits = 400
)

// checkText refuses what PostgreSQL text cannot hold (NUL, invalid UTF-8:
// the server would fail the whole batch with 22021) and strings over their
// bound, naming the field.
func checkText(r Request) *ValidationError {
	for _, f := range []struct {
		name, value string
		max         int
	}{
		{"tenant", r.Tenant, MaxTenantChars},
		{"key", r.Key, MaxKeyChars},
		{"channel", string(r.Channel), 0},
		{"recipient", r.Recipient, MaxRecipientChars},
		{"template", r.Template, MaxTemplateChars},
	} {
		if verr := CheckString(f.name, f.value); verr != nil {
			return verr
		}
		if f.max > 0 && utf8.RuneCountInString(f.value) > f.max {
			return &ValidationError{Field: f.name, Reason: fmt.Sprintf("must be at most %d characters", f.max)}
		}
	}
	return nil
}

// CheckString refuses a string PostgreSQL text cannot hold: invalid UTF-8
// or a NUL character. field names it in the error.
func CheckString(field, s string) *ValidationError {
	if !utf8.ValidString(s) {
		return &ValidationError{Field: field, Reason: fmt.Sprintf("must be valid UTF-8 (byte %d is not)", invalidAt(s))}
	}
	if i := strings.IndexByte(s, 0); i >= 0 {
		return &ValidationError{Field: field, Reason: fmt.Sprintf("must not contain a NUL character (U+0000 at byte %d)", i)}
	}
	return nil
}

func invalidAt(s string) int {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return i
			}
		}
	}
	return len(s)
}

// CheckData validates data, the JSON text of a reminder's template data,
// the way PostgreSQL's jsonb will read it, so that a value it would refuse is
// reported for its own reminder instead of failing a batch: a JSON object
// of valid UTF-8, at most MaxDataBytes long and MaxDataDepth deep, with no
// \u0000 escape or unpaired UTF-16 surrogate in its strings and no number
// longer than MaxDataNumberDigits written out.
func CheckData(data []byte) *ValidationError {
	bad := func(format string, args ...any) *ValidationError {
		return &ValidationError{Field: "data", Reason: fmt.Sprintf(format, args...)}
	}
	if len(data) > MaxDataBytes {
		return bad("must be at most %d bytes as JSON, got %d", MaxDataBytes, len(data))
	}
	if !utf8.Valid(data) {
		return bad("must be valid UTF-8 (byte %d is not)", invalidAt(string(data)))
	}
	if verr := scanData(data); verr != nil {
		return verr
	}
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) == 0 || t[0] != '{' || !json.Valid(data) {
		return bad("must be a JSON object")
	}
	return nil
}

// scanData finds, in one pass, what json.Valid accepts and PostgreSQL does
// not (or stores many times larger). It runs before json.Valid, whose own
// depth limit is far deeper, so it must not assume data is valid JSON.
func scanData(data []byte) *ValidationError {
	bad := func(format string, args ...any) *ValidationError {
		return &ValidationError{Field: "data", Reason: fmt.Sprintf(format, args...)}
	}
	depth, inString := 0, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		if inString {
			switch {
			case c == '"':
				inString = false
			case c == '\\' && i+1 < len(data) && data[i+1] != 'u':
				i++ // an escaped character: skip it
			case c == '\\' && i+6 <= len(data):
				r := hex4(data[i+2 : i+6])
				switch {
				case r == 0:
					return bad(`must not contain a NUL character (\u0000 at byte %d)`, i)
				case r >= 0xD800 && r < 0xDC00:
					if i+12 > len(data) || data[i+6] != '\\' || data[i+7] != 'u' || !isLowSurrogate(hex4(data[i+8:i+12])) {
						return bad(`holds an unpaired UTF-16 surrogate (\u%04x at byte %d)`, r, i)
					}
					i += 11
				case isLowSurrogate(r):
					return bad(`holds an unpaired UTF-16 surrogate (\u%04x at byte %d)`, r, i)
				default:
					i += 5
				}
			}
			continue
		}
		switch {
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			if depth++; depth > MaxDataDepth {
				return bad("must nest at most %d objects and arrays deep", MaxDataDepth)
			}
		case c == '}' || c == ']':
			depth--
		case c == '-' || c >= '0' && c <= '9':
			end := i + 1
			for end < len(data) && bytes.IndexByte([]byte("0123456789.eE+-"), data[end]) >= 0 {
				end++
			}
			if n := writtenOutDigits(data[i:end]); n > MaxDataNumberDigits {
				return bad("number %.20q at byte %d has %d digits written out in full, the limit is %d",
					data[i:end], i, n, MaxDataNumberDigits)
			}
			i = end - 1
		}
	}
	return nil
}

// hex4 reads four hex digits; anything else reads as -1.
func hex4(b []byte) rune {
	n, err := strconv.ParseUint(string(b), 16, 32)
	if err != nil {
		return -1
	}
	return rune(n)
}

func isLowSurrogate(r rune) bool { return r >= 0xDC00 && r < 0xE000 }

// writtenOutDigits is how many digits the JSON number num has written in
// full without an exponent (1e3 → 4, 1.5e-3 → 5), as PostgreSQL prints it;
// a number whose exponent does not even parse counts as unbounded.
func writtenOutDigits(num []byte) int {
	mant, expStr, hasExp := bytes.Cut(bytes.TrimPrefix(num, []byte("-")), []byte("e"))
	if !hasExp {
		mant, expStr, hasExp = bytes.Cut(bytes.TrimPrefix(num, []byte("-")), []byte("E"))
	}
	exp := 0
	if hasExp {
		e, err := strconv.Atoi(string(bytes.TrimPrefix(expStr, []byte("+"))))
		if err != nil || e > 1<<20 || e < -(1<<20) {
			return 1 << 30
		}
		exp = e
	}
	intPart, frac, _ := bytes.Cut(mant, []byte("."))
	intDigits, fracDigits := len(intPart)+exp, len(frac)-exp
	return max(intDigits, 1) + max(fracDigits, 0)
}
