// Package testenv connects tests to the real services Nudge runs against
// (PostgreSQL, RabbitMQ, an SMTP server) and isolates each test: its own
// PostgreSQL schema, its own queue-name prefix, its own Mailpit instance.
//
// A missing service fails the test when CI=true and skips it, loudly, on a
// developer's machine without it. Under go test -short (make test-short)
// every helper here that needs a service skips the test before trying to
// reach it, CI=true or not: -short means "unit tests only, no services".
package testenv

import (
	"os"
	"testing"
)

// needs skips the test under -short before it touches service.
func needs(tb testing.TB, service string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("-short: needs " + service)
	}
}

// Unavailable fails the test under CI and skips it otherwise (and always
// under -short), naming the missing service and how to provide it.
func Unavailable(tb testing.TB, service, how string, err error) {
	tb.Helper()
	needs(tb, service)
	msg := "INTEGRATION TEST NOT RUN: " + service + " is unavailable (" + how + ")"
	if err != nil {
		msg += ": " + err.Error()
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg)
	}
	tb.Skip("\n\n*** " + msg + " ***\n")
}
