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
