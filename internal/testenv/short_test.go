package testenv

import (
	"testing"
)

// make test-short promises "no services needed": under -short every helper
// that needs one skips before reaching for it, even under CI=true, where a
// missing service would otherwise fail the test.
func TestShortSkipsEveryServiceEvenUnderCI(t *testing.T) {
	if !testing.Short() {
		t.Skip("checks what -short does")
	}
	t.Setenv("CI", "true")
	t.Setenv("NUDGE_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:1/test?sslmode=disable")
	t.Setenv("NUDGE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
	for name, helper := range map[string]func(testing.TB){
		"Postgres":         func(tb testing.TB) { Postgres(tb) },
		"RabbitMQ":         func(tb testing.TB) { RabbitMQ(tb) },
		"Mailpit":          func(tb testing.TB) { Mailpit(tb) },
		"CloseConnections": func(tb testing.TB) { CloseConnections(tb, "nothing") },
		"Binaries":         func(tb testing.TB) { Binaries(tb) },
		"Unavailable":      func(tb testing.TB) { Unavailable(tb, "a service", "start it", nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if !t.Skipped() {
					t.Errorf("%s did not skip under -short", name)
				}
			}()
			helper(t)
		})
	}
}
