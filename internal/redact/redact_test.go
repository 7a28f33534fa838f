package redact_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"postgres://postgres@127.0.0.1:5432/test", "postgres://postgres@127.0.0.1:5432/test"},
		{"amqp://guest:guest@127.0.0.1:5672/", "amqp://guest:xxxxx@127.0.0.1:5672/"},
		{"amqp://u:pa/ss@host:5672/vhost", "amqp://u:xxxxx@host:5672/vhost"},
		{"amqp://u:p@ss@host/", "amqp://u:xxxxx@host/"},
		{"smtp://u:p:a:ss@host:587?tls=starttls", "smtp://u:xxxxx@host:587?tls=starttls"},
		{"smtp://u:p%zz@host", "smtp://u:xxxxx@host"},
		{"smtp://u:12?x@host", "smtp://u:xxxxx@host"},
		{"smtp://u:12#x@host", "smtp://u:xxxxx@host"},
		{"https://u/x:y@host", "https://xxxxx@host"},
		// An "@" in the query is taken for the end of the user information:
		// hiding too much beats showing a password.
		{"smtp://h:25?from=a@b.example", "smtp://h:xxxxx@b.example"},
		{"postgres://u@h/db?sslmode=verify-full&password=s3cret&x=1", "postgres://u@h/db?sslmode=verify-full&password=xxxxx&x=1"},
		{"https://sms.example/?token=abc#f", "https://sms.example/?token=xxxxx#f"},
		{"host=db user=u password=s3cret dbname=x", "host=db user=u password=xxxxx dbname=x"},
		{"host=db password='s3 cr\\'et' dbname=x", "host=db password=xxxxx dbname=x"},
		{"host=db sslkey=/k.pem", "host=db sslkey=/k.pem"},
		{"", ""},
	} {
		if got := redact.URL(tc.in); got != tc.want {
			t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// secrets holds each reserved character a password may contain.
var secrets = []string{"Qj/Kx", "Qj@Kx", "Qj:Kx", "Qj%Kx", "Qj?Kx", "Qj#Kx", "12/Kx", "12?Kx", "12#Kx", "Q3/Vr@Wt:%?#Zy"}

// TestParseNeverQuotesThePassword is the regression test for issue 13,
// finding 4: a password with a reserved character appeared in parse errors.
func TestParseNeverQuotesThePassword(t *testing.T) {
	t.Parallel()
	for _, secret := range secrets {
		for _, form := range []string{"amqp://user:%s@host:5672/v", "smtp://user:%s@host:587?tls=starttls", "postgres://user:%s@host/x"} {
			raw := strings.Replace(form, "%s", secret, 1)
			u, err := redact.Parse(raw)
			if err == nil {
				p, _ := u.User.Password()
				require.Equal(t, secret, p, "%s parsed, so the password must be intact", raw)
				continue
			}
			require.ErrorIs(t, err, redact.ErrInvalid)
			for _, part := range fragments(secret) {
				require.NotContains(t, err.Error(), part, "error for %q", raw)
			}
			require.Contains(t, err.Error(), "user:xxxxx@host", "error should show the safe form")
		}
	}
}

// fragments are the pieces of secret a leak would show: the text on either
// side of each reserved character.
func fragments(secret string) []string {
	out := strings.FieldsFunc(secret, func(r rune) bool { return strings.ContainsRune("/@:%?#", r) })
	return append(out, secret)
}

func TestCheck(t *testing.T) {
	t.Parallel()
	cause := errors.New("scheme must be amqp or amqps")
	failHTTP := func(s string) error {
		if strings.HasPrefix(s, "http:") {
			return cause
		}
		return nil
	}
	require.NoError(t, redact.Check("amqp://u:pw@host/", failHTTP))

	err := redact.Check("http://host/", failHTTP)
	require.ErrorIs(t, err, cause, "nothing to hide: the parser's error is kept")
	require.ErrorIs(t, err, redact.ErrInvalid)

	quoting := func(s string) error { return fmt.Errorf("bad %q: %w", s, failHTTP(s)) }
	err = redact.Check("http://u:pw@host/", quoting)
	require.ErrorIs(t, err, cause, "the error of the safe form is kept")
	require.NotContains(t, err.Error(), "pw@")
	require.Contains(t, err.Error(), "u:xxxxx@host")

	err = redact.Check("amqp://u:p%zz@host/", func(s string) error { _, err := url.Parse(s); return err })
	require.ErrorIs(t, err, redact.ErrInvalid)
	require.NotContains(t, err.Error(), "zz")
	require.Contains(t, err.Error(), "percent-encode", "the safe form parses: the problem was in the password")
}

func TestParseAcceptsEncodedPasswords(t *testing.T) {
	t.Parallel()
	for _, secret := range secrets {
		raw := "amqp://" + url.UserPassword("user", secret).String() + "@host:5672/v?from=a@b.example"
		u, err := redact.Parse(raw)
		require.NoError(t, err, raw)
		p, _ := u.User.Password()
		require.Equal(t, secret, p)
	}
}
