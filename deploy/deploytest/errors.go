package deploytest

import (
	"strings"
	"testing"
)

// WantError fails the test unless one of errs mentions want, and logs the
// one that does.
func WantError(tb testing.TB, errs []error, want string) {
	tb.Helper()
	for _, e := range errs {
		if strings.Contains(e.Error(), want) {
			tb.Logf("caught: %v", e)
			return
		}
	}
	tb.Errorf("no error mentions %q; got %v", want, errs)
}

// NoErrors reports each of errs as an error of the test.
func NoErrors(tb testing.TB, errs []error) {
	tb.Helper()
	for _, err := range errs {
		tb.Error(err)
	}
}
