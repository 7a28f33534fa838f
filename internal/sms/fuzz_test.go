package sms

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nudgehq/nudge/internal/provider"
)

// FuzzParseRetryAfter: any header value asks for a wait between zero and
// MaxRetryAfter, and delay-seconds within it are taken as written.
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"", "0", "120", "3600", "3601", "99999999999999999999", "-5", " 7 ",
		"Wed, 21 Oct 2015 07:28:00 GMT", "Sun, 06 Nov 1994 08:49:37 GMT", "1.5", "+3", "٣"} {
		f.Add(s, int64(1445412480))
	}
	f.Fuzz(func(t *testing.T, value string, nowUnix int64) {
		now := time.Unix(nowUnix%(1<<40), 0)
		got := ParseRetryAfter(value, now)
		if got < 0 || got > MaxRetryAfter {
			t.Fatalf("Retry-After %q: wait %s, want 0 to %s", value, got, MaxRetryAfter)
		}
		if secs, err := strconv.ParseUint(strings.TrimSpace(value), 10, 32); err == nil && isDigits(strings.TrimSpace(value)) &&
			time.Duration(secs)*time.Second <= MaxRetryAfter && got != time.Duration(secs)*time.Second {
			t.Fatalf("Retry-After %q: wait %s, want %d s", value, got, secs)
		}
	})
}

// FuzzInterpret feeds the provider-response parser any status, body and
// Retry-After: a 2xx with an id is that id; everything else is a
// *provider.Error with a kind and a code, whose message is one short line
// however large or binary the body.
func FuzzInterpret(f *testing.F) {
	for _, s := range []struct {
		status int
		body   string
	}{{202, `{"id":"m-1"}`}, {200, `{}`}, {200, `not json`}, {429, `slow down`}, {503, ""}, {400, "{\"error\":\"bad\nnumber\"}"},
		{301, ""}, {99, ""}, {1000, ""}, {200, `{"id":""}`}, {500, strings.Repeat("é", 300)}} {
		f.Add(s.status, []byte(s.body), "3")
	}
	c := &Client{now: func() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) }}
	f.Fuzz(func(t *testing.T, status int, body []byte, retryAfter string) {
		id, err := c.interpret(status, retryAfter, body)
		if err == nil {
			if status < 200 || status >= 300 || id == "" {
				t.Fatalf("status %d: accepted with id %q", status, id)
			}
			return
		}
		var pe *provider.Error
		if !errors.As(err, &pe) || pe.Code == "" || (pe.Kind != provider.Retryable && pe.Kind != provider.Permanent) {
			t.Fatalf("status %d: %T %v, want a *provider.Error with a kind and a code", status, err, err)
		}
		if msg := err.Error(); strings.ContainsAny(msg, "\n\r") || len(msg) > 4*maxErrorExcerpt+200 {
			t.Fatalf("status %d: a %d-byte or multi-line error: %q", status, len(msg), msg)
		}
		if pe.RetryAfter < 0 || pe.RetryAfter > MaxRetryAfter {
			t.Fatalf("status %d: retry after %s", status, pe.RetryAfter)
		}
	})
}
