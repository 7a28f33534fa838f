// Package testenv connects tests to the real services Nudge runs against
// (PostgreSQL, RabbitMQ, an SMTP server) and isolates each test: its own
// PostgreSQL schema, its own queue-name prefix, its own Mailpit instance.
//
// A missing service fails the test when CI=true and skips it, loudly, on a
// developer's machine without it.
package testenv

import (
	"os"
	"testing"
)

// Unavailable fails the test under CI and skips it otherwise, naming the
// missing service and how to provide it.
func Unavailable(tb testing.TB, service, how string, err error) {
	tb.Helper()
	msg := "INTEGRATION TEST NOT RUN: " + service + " is unavailable (" + how + ")"
	if err != nil {
		msg += ": " + err.Error()
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg)
	}
	tb.Skip("\n\n*** " + msg + " ***\n")
}
