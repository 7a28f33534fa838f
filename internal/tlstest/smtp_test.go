package tlstest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/email"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/testenv"
)

// The email sender verifies the relay over required STARTTLS and implicit
// TLS against ca=; another CA is refused, and the default (smtp:// with no
// tls=) does not fall back to plain text.
func TestSMTPVerified(t *testing.T) {
	s := setup(t)
	cert, key, err := s.ca.Server("smtp")
	require.NoError(t, err)
	withCert := []string{"--smtp-tls-cert", cert, "--smtp-tls-key", key, "--smtp-auth-accept-any"}
	for _, tc := range []struct {
		name    string
		mailpit []string
		url     string // %s: host:port; %s: CA file
		ca      *testenv.CA
		want    string // provider error code; "" means delivered
	}{
		{"STARTTLS", []string{"--smtp-require-starttls"}, "smtp://u:%s@%s?tls=starttls&ca=%s", s.ca, ""},
		{"STARTTLS by default", []string{"--smtp-require-starttls"}, "smtp://u:%s@%s?ca=%s", s.ca, ""},
		{"implicit TLS", []string{"--smtp-require-tls"}, "smtps://u:%s@%s?ca=%s", s.ca, ""},
		{"STARTTLS, another CA", []string{"--smtp-require-starttls"}, "smtp://u:%s@%s?ca=%s", s.wrong, "tls"},
		{"implicit TLS, another CA", []string{"--smtp-require-tls"}, "smtps://u:%s@%s?ca=%s", s.wrong, "tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mp := testenv.Mailpit(t, append(withCert, tc.mailpit...)...)
			raw := fmt.Sprintf(tc.url, urlPassword(smtpPassword), mp.SMTPAddr(), tc.ca.File) + "&from=reminders@nudge.test"
			err := send(t, raw)
			if tc.want != "" {
				var pe *provider.Error
				require.ErrorAs(t, err, &pe)
				require.Equal(t, tc.want, pe.Code, "%v", err)
				require.Contains(t, err.Error(), "certificate signed by unknown authority")
				requireNoSecrets(t, err.Error())
				return
			}
			require.NoError(t, err)
			_, err = mp.WaitForCount(ctxT(t), 1)
			require.NoError(t, err)
		})
	}

	// Issue 13, finding 9: the default used to continue in plain text with a
	// relay that offers no STARTTLS.
	t.Run("no STARTTLS offered", func(t *testing.T) {
		t.Parallel()
		mp := testenv.Mailpit(t)
		err := send(t, "smtp://"+mp.SMTPAddr()+"?from=reminders@nudge.test")
		require.Error(t, err)
		n, cerr := mp.Count(ctxT(t))
		require.NoError(t, cerr)
		require.Zero(t, n)
	})
}

func send(t *testing.T, raw string) error {
	t.Helper()
	cfg, err := email.ParseSMTPURL(raw)
	require.NoError(t, err)
	tmpl, err := email.LoadTemplates("")
	require.NoError(t, err)
	sender, err := email.New(cfg, tmpl)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sender.Close() })
	_, err = sender.Send(ctxT(t), provider.Message{
		ReminderID: 1, IdempotencyKey: "tlstest-1", Tenant: "acme", Recipient: "ada@example.com",
		Template: "course-expiry", Data: map[string]any{"course": "Go 101"}, Deadline: time.Now().Add(time.Hour),
	})
	return err
}
