// Package redact turns connection strings (database, broker, SMTP and SMS
// provider URLs) into forms that are safe to print. Parsers quote their input
// in their errors (net/url, pgx and amqp091-go all do), and a password that
// holds a reserved character such as "/" or "@" breaks the URL in a way that
// puts part of it where the parser reports it (as a port, a path, a query
// key). So every place that parses such a URL reports failures through this
// package, never with the parser's own message about the original string.
//
// The rules err on the side of hiding: when it is not clear where the user
// information ends (an "@" after a "/", "?" or "#"), everything up to the
// last "@" is treated as user information.
package redact

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Mask replaces every hidden value, as net/url's URL.Redacted does.
const Mask = "xxxxx"

// ErrInvalid is wrapped by every error Parse and ParseError return.
var ErrInvalid = errors.New("not a valid URL")

// secretParams are query and keyword parameters whose values are hidden.
var secretParams = []string{
	"password", "passwd", "pass", "pwd", "sslpassword", "secret", "token",
	"access_token", "api_key", "apikey", "key", "auth_token",
}

var (
	// name=value in a query string (after ?, & or ;).
	queryParam = regexp.MustCompile(`(?i)([?&;](?:` + strings.Join(secretParams, "|") + `)=)([^&;#]*)`)
	// name=value or name='quoted value' in a PostgreSQL keyword/value string.
	keywordParam = regexp.MustCompile(`(?i)(^|\s)((?:` + strings.Join(secretParams, "|") + `)\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)`)
)

// URL returns raw with the password of its user information and the values
// of secret-bearing parameters (password=, token=, ...) replaced by Mask. It
// works on strings that do not parse, and on PostgreSQL keyword/value
// strings ("host=db password=..."). A string with nothing to hide comes back
// unchanged.
func URL(raw string) string {
	scheme, rest, isURL := strings.Cut(raw, "://")
	if !isURL {
		return keywordParam.ReplaceAllString(raw, "${1}${2}"+Mask)
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		user, _, hasPassword := strings.Cut(rest[:at], ":")
		switch {
		case strings.ContainsAny(user, "/?#"):
			// Not even the user name is clearly separate: hide it all.
			rest = Mask + rest[at:]
		case hasPassword:
			rest = user + ":" + Mask + rest[at:]
		}
	}
	return scheme + "://" + queryParam.ReplaceAllString(rest, "${1}"+Mask)
}

// Redacts reports whether URL(raw) hides anything.
func Redacts(raw string) bool { return URL(raw) != raw }

// hint is appended when the part of the URL that failed was hidden.
const hint = "percent-encode reserved characters in the user name and password " +
	"(/ as %2F, @ as %40, : as %3A, % as %25, ? as %3F, # as %23)"

// Check runs parse on raw and returns nil when it succeeds. Otherwise it
// returns an error wrapping ErrInvalid that is safe to print: when raw holds
// nothing to hide, parse's own error; when it does, parse's error is dropped
// (it may quote the secret) and parse runs again on URL(raw), whose error can
// quote only the safe form. If the safe form parses, the problem was in what
// was hidden, and the error says how to encode a password.
func Check(raw string, parse func(string) error) error {
	err := parse(raw)
	if err == nil {
		return nil
	}
	if !Redacts(raw) {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	safe := URL(raw)
	if serr := parse(safe); serr != nil {
		var ue *url.Error
		if errors.As(serr, &ue) && ue.URL == safe {
			serr = ue.Err
		}
		return fmt.Errorf("%w: %s: %w", ErrInvalid, safe, serr)
	}
	return fmt.Errorf("%w: %s: %s", ErrInvalid, safe, hint)
}

// Parse parses raw with net/url and reports failures through ParseError. It
// also refuses a URL that parses but whose user information probably holds
// an unencoded "/", "?" or "#": an "@" in the path, in the fragment or in a
// query parameter's name ("amqp://u:12/x@host/" parses as host "u", port 12,
// and the rest of the password as the path).
func Parse(raw string) (*url.URL, error) {
	if err := Check(raw, func(s string) error { _, err := url.Parse(s); return err }); err != nil {
		return nil, err
	}
	u, _ := url.Parse(raw)
	misplaced := strings.Contains(u.Path, "@") || strings.Contains(u.Fragment, "@")
	for part := range strings.SplitSeq(u.RawQuery, "&") {
		if name, _, _ := strings.Cut(part, "="); strings.Contains(name, "@") {
			misplaced = true
		}
	}
	if misplaced {
		return nil, fmt.Errorf("%w: %s: an \"@\" after the host; %s", ErrInvalid, URL(raw), hint)
	}
	return u, nil
}
