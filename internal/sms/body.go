package sms

import (
	"strconv"
	"unicode/utf8"
)

// The generic API's request body is a JSON object of five strings:
//
//	{"to":…,"body":…,"reference":…,"tenant":…,"from":…}
//
// ("from" only when a sender is configured). It is written here by
// appending, byte for byte what encoding/json.Marshal writes for that
// struct (TestAppendRequestMatchesMarshal), without its reflection and its
// copy of the result.

// requestSize is an upper bound of the body's length when no string needs
// escaping, so the body is written into one allocation in the common case.
func requestSize(to, body, tenant, from string) int {
	return len(`{"to":"","body":"","reference":"","tenant":"","from":""}`) + len(to) + len(body) + 20 + len(tenant) + len(from)
}

// appendRequest appends the body of a send to dst.
func appendRequest(dst []byte, to, body string, reference int64, tenant, from string) []byte {
	dst = append(dst, `{"to":`...)
	dst = appendJSONString(dst, to)
	dst = append(dst, `,"body":`...)
	dst = appendJSONString(dst, body)
	dst = append(dst, `,"reference":"`...)
	dst = strconv.AppendInt(dst, reference, 10) // digits and '-': nothing to escape
	dst = append(dst, `","tenant":`...)
	dst = appendJSONString(dst, tenant)
	if from != "" {
		dst = append(dst, `,"from":`...)
		dst = appendJSONString(dst, from)
	}
	return append(dst, '}')
}

const lowerHex = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json quotes a string with
// HTML escaping (its default): `"` and `\` escaped, \b \f \n \r \t short,
// other control bytes and < > & as \u00XX, invalid UTF-8 as \ufffd, U+2028
// and U+2029 as \u2028 and \u2029.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', lowerHex[b>>4], lowerHex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', lowerHex[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// acceptedID reads the id of an acceptance answer when it has the plain
// shape providers send, a flat object of strings (and true, false, null)
// with ASCII keys and nothing escaped: {"id":"m-1","status":"accepted"}. It
// gives what json.Unmarshal gives into acceptance, the string of the last
// key equal to "id" but for case (FuzzAcceptedID); ok is false for any
// other body, which the caller then decodes with encoding/json.
func acceptedID(body []byte) (id string, ok bool) {
	i := skipSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return "", false
	}
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return "", skipSpace(body, i+1) == len(body)
	}
	for {
		ks, ke, next, isString := plainToken(body, i)
		if !isString {
			return "", false
		}
		for _, c := range body[ks:ke] {
			if c >= utf8.RuneSelf {
				return "", false // non-ASCII keys fold in ways not worth copying
			}
		}
		i = skipSpace(body, next)
		if i == len(body) || body[i] != ':' {
			return "", false
		}
		vs, ve, next, isString := plainToken(body, skipSpace(body, i+1))
		if vs < 0 {
			return "", false
		}
		if isID := ke-ks == 2 && body[ks]|0x20 == 'i' && body[ks+1]|0x20 == 'd'; isID {
			if !isString {
				return "", false // null keeps an earlier id, true or false is an error: encoding/json's call
			}
			id = string(body[vs:ve])
		}
		i = skipSpace(body, next)
		if i == len(body) {
			return "", false
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
		case '}':
			return id, skipSpace(body, i+1) == len(body)
		default:
			return "", false
		}
	}
}

// plainToken reads, at i, a string with nothing escaped and no control
// byte, in valid UTF-8 (its contents are body[start:end], isString), or
// true, false or null (isString false); start is -1 for anything else.
func plainToken(body []byte, i int) (start, end, next int, isString bool) {
	if i < len(body) && body[i] == '"' {
		for j := i + 1; j < len(body); j++ {
			switch c := body[j]; {
			case c == '"':
				if !utf8.Valid(body[i+1 : j]) {
					return -1, -1, 0, false
				}
				return i + 1, j, j + 1, true
			case c == '\\' || c < 0x20:
				return -1, -1, 0, false
			}
		}
		return -1, -1, 0, false
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(body)-i >= len(lit) && string(body[i:i+len(lit)]) == lit {
			return i, i, i + len(lit), false
		}
	}
	return -1, -1, 0, false
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(body []byte, i int) int {
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r') {
		i++
	}
	return i
}
