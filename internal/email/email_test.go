package email_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/email"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/testenv"
)

// TestMain fails the package if a test leaves a Sender goroutine behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := waitForLeaks(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "leaked goroutines:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

func waitForLeaks(wait time.Duration) string {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			if strings.Contains(g, "nudge/internal/email.") && !strings.Contains(g, "email_test.") {
				leaked = append(leaked, g)
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type bundle struct {
	mp     *testenv.MailpitServer
	sender *email.Sender
	cfg    email.Config
}

// setup starts a Mailpit for the test and a Sender pointed at it.
func setup(t *testing.T, mailpitArgs ...string) bundle {
	t.Helper()
	mp := testenv.Mailpit(t, mailpitArgs...)
	cfg, err := email.ParseSMTPURL(mp.SMTPURL() + "&from=" + "Nudge%20%3Creminders@nudge.test%3E&domain=msg.nudge.test")
	require.NoError(t, err)
	return bundle{mp: mp, sender: newSender(t, cfg, ""), cfg: cfg}
}

func newSender(t *testing.T, cfg email.Config, templateDir string) *email.Sender {
	t.Helper()
	tmpl, err := email.LoadTemplates(templateDir)
	require.NoError(t, err)
	s, err := email.New(cfg, tmpl)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

func reminder(id int64, to string) provider.Message {
	return provider.Message{
		ReminderID:     id,
		IdempotencyKey: fmt.Sprintf("rem-%d", id),
		Tenant:         "acme",
		Recipient:      to,
		Template:       "course-expiry",
		Data:           map[string]any{"course": "Go 101", "learner": "Ada"},
		Deadline:       time.Date(2031, 3, 14, 9, 0, 0, 0, time.UTC),
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func requireKind(t *testing.T, err error, kind provider.Kind, code string) {
	t.Helper()
	require.Error(t, err)
	var pe *provider.Error
	require.ErrorAs(t, err, &pe, "want *provider.Error, got %T: %v", err, err)
	require.Equal(t, kind, pe.Kind, "kind of %v", err)
	require.Equal(t, code, pe.Code, "code of %v", err)
	t.Logf("classified: %v", err)
}

func TestSendLandsInMailpit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)

	id, err := b.sender.Send(ctx, reminder(42, "ada@example.com"))
	require.NoError(t, err)
	require.Equal(t, "rem-42@msg.nudge.test", id)

	msgs, err := b.mp.WaitForCount(ctx, 1)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	got := msgs[0]
	require.Equal(t, []string{"ada@example.com"}, got.To)
	require.Equal(t, "reminders@nudge.test", got.From)
	require.Equal(t, "Go 101 expires soon", got.Subject)
	require.Equal(t, id, got.MessageID)

	h, err := b.mp.Headers(ctx, got.ID)
	require.NoError(t, err)
	require.Equal(t, []string{"<rem-42@msg.nudge.test>"}, h["Message-Id"])
	require.Equal(t, []string{"42"}, h["X-Nudge-Reminder-Id"])
	require.Equal(t, []string{"rem-42"}, h["X-Nudge-Idempotency-Key"])
	require.Equal(t, []string{"acme"}, h["X-Nudge-Tenant"])
	require.Equal(t, []string{"auto-generated"}, h["Auto-Submitted"])

	d, err := b.mp.Message(ctx, got.ID)
	require.NoError(t, err)
	require.Contains(t, d.Text, "Hello Ada,")
	require.Contains(t, d.Text, "Go 101 expires on Friday 14 March 2031")
	require.Contains(t, d.Text, "Reminder 42")
	require.Contains(t, d.HTML, "<strong>Go 101</strong>")
	require.Contains(t, d.HTML, "Hello Ada,")
}

func TestHTMLIsEscaped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	msg := reminder(1, "ada@example.com")
	msg.Data["course"] = "<script>x</script>"
	_, err := b.sender.Send(ctx, msg)
	require.NoError(t, err)
	msgs, err := b.mp.WaitForCount(ctx, 1)
	require.NoError(t, err)
	d, err := b.mp.Message(ctx, msgs[0].ID)
	require.NoError(t, err)
	require.NotContains(t, d.HTML, "<script>")
	require.Contains(t, d.HTML, "&lt;script&gt;")
}

// Retries of one reminder carry one Message-ID, which is how duplicate
// deliveries are counted in the sink.
func TestSameReminderTwiceSharesMessageID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	msg := reminder(7, "ada@example.com")
	id1, err := b.sender.Send(ctx, msg)
	require.NoError(t, err)
	id2, err := b.sender.Send(ctx, msg)
	require.NoError(t, err)
	require.Equal(t, id1, id2)

	msgs, err := b.mp.WaitForCount(ctx, 2)
	require.NoError(t, err)
	require.Len(t, msgs, 2)
	require.NotEqual(t, msgs[0].ID, msgs[1].ID)
	require.Equal(t, "rem-7@msg.nudge.test", msgs[0].MessageID)
	require.Equal(t, "rem-7@msg.nudge.test", msgs[1].MessageID)
}

func TestConcurrentSendsAllArrive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	const goroutines, perG = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*perG)
	for g := range goroutines {
		wg.Go(func() {
			for i := range perG {
				id := int64(g*perG + i)
				if _, err := b.sender.Send(ctx, reminder(id, fmt.Sprintf("u%d@example.com", id))); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	msgs, err := b.mp.WaitForCount(ctx, goroutines*perG)
	require.NoError(t, err)
	require.Len(t, msgs, goroutines*perG)
	ids := map[string]bool{}
	for _, m := range msgs {
		ids[m.MessageID] = true
	}
	require.Len(t, ids, goroutines*perG, "every reminder arrives exactly once")
}

// Template and address problems are found before SMTP: nothing is sent.
func TestPermanentFailuresSendNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)

	dir := t.TempDir()
	write(t, dir, "broken-at-runtime.subject.tmpl", `{{index .items 3}}`)
	write(t, dir, "broken-at-runtime.txt.tmpl", `body`)
	custom := newSender(t, b.cfg, dir)

	unknown := reminder(1, "ada@example.com")
	unknown.Template = "no-such-template"
	_, err := b.sender.Send(ctx, unknown)
	requireKind(t, err, provider.Permanent, "template")
	require.ErrorIs(t, err, email.ErrUnknownTemplate)

	execFails := reminder(2, "ada@example.com")
	execFails.Template = "broken-at-runtime"
	execFails.Data = map[string]any{"items": []string{"a"}}
	_, err = custom.Send(ctx, execFails)
	requireKind(t, err, provider.Permanent, "template")

	badAddr := reminder(3, "not an address")
	_, err = b.sender.Send(ctx, badAddr)
	requireKind(t, err, provider.Permanent, "address")

	noKey := reminder(4, "ada@example.com")
	noKey.IdempotencyKey = ""
	_, err = b.sender.Send(ctx, noKey)
	requireKind(t, err, provider.Permanent, "message")

	// A good message afterwards is the only one in the sink.
	_, err = b.sender.Send(ctx, reminder(5, "ada@example.com"))
	require.NoError(t, err)
	msgs, err := b.mp.WaitForCount(ctx, 1)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, "rem-5@msg.nudge.test", msgs[0].MessageID)
}

func TestRejectedRecipientIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t, "--smtp-allowed-recipients", `@example\.com$`)
	ctx := ctxT(t)

	_, err := b.sender.Send(ctx, reminder(1, "someone@elsewhere.test"))
	requireKind(t, err, provider.Permanent, "smtp_550")

	// The sender recovers: the next message goes through.
	_, err = b.sender.Send(ctx, reminder(2, "ada@example.com"))
	require.NoError(t, err)
	msgs, err := b.mp.WaitForCount(ctx, 1)
	require.NoError(t, err)
	require.Len(t, msgs, 1)
}

func TestSMTPReplyCodesAreClassified(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	cases := []struct {
		name  string
		chaos testenv.MailpitChaos
		kind  provider.Kind
		code  string
	}{
		{"4xx on RCPT is retryable", testenv.MailpitChaos{Recipient: testenv.MailpitChaosTrigger{ErrorCode: 451, Probability: 100}}, provider.Retryable, "smtp_451"},
		{"452 on RCPT is retryable", testenv.MailpitChaos{Recipient: testenv.MailpitChaosTrigger{ErrorCode: 452, Probability: 100}}, provider.Retryable, "smtp_452"},
		{"553 on RCPT is permanent", testenv.MailpitChaos{Recipient: testenv.MailpitChaosTrigger{ErrorCode: 553, Probability: 100}}, provider.Permanent, "smtp_553"},
		{"4xx on MAIL FROM is retryable", testenv.MailpitChaos{Sender: testenv.MailpitChaosTrigger{ErrorCode: 421, Probability: 100}}, provider.Retryable, "smtp_421"},
		// The sender is configuration, not the reminder: do not fail it for good.
		{"5xx on MAIL FROM is retryable", testenv.MailpitChaos{Sender: testenv.MailpitChaosTrigger{ErrorCode: 550, Probability: 100}}, provider.Retryable, "smtp_550"},
	}
	for i, tc := range cases { // sequential: they share one Mailpit
		require.NoError(t, b.mp.SetChaos(ctx, tc.chaos), tc.name)
		_, err := b.sender.Send(ctx, reminder(int64(i), "ada@example.com"))
		requireKind(t, err, tc.kind, tc.code)
	}
	require.NoError(t, b.mp.SetChaos(ctx, testenv.MailpitChaos{}))
	_, err := b.sender.Send(ctx, reminder(99, "ada@example.com"))
	require.NoError(t, err)
	n, err := b.mp.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

func TestServerDownIsRetryable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	cfg, err := email.ParseSMTPURL("smtp://" + addr + "?tls=none&from=reminders@nudge.test")
	require.NoError(t, err)
	s := newSender(t, cfg, "")
	_, err = s.Send(ctxT(t), reminder(1, "ada@example.com"))
	requireKind(t, err, provider.Retryable, "network")
}

// A server that accepts but never greets: the caller's deadline, not the
// 15 s SMTP timeout, ends the send.
func TestContextDeadlineEndsSend(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held sync.WaitGroup
	held.Go(func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(io.Discard, c) // until the client closes
			_ = c.Close()
		}
	})
	t.Cleanup(func() { _ = ln.Close(); held.Wait() })

	cfg, err := email.ParseSMTPURL("smtp://" + ln.Addr().String() + "?tls=none&from=reminders@nudge.test")
	require.NoError(t, err)
	s := newSender(t, cfg, "")
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.Send(ctx, reminder(1, "ada@example.com"))
	requireKind(t, err, provider.Retryable, "timeout")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestStartTLSRequiredButNotOffered(t *testing.T) {
	t.Parallel()
	mp := testenv.Mailpit(t)
	url := strings.Replace(mp.SMTPURL(), "tls=none", "tls=starttls", 1) + "&from=reminders@nudge.test"
	cfg, err := email.ParseSMTPURL(url)
	require.NoError(t, err)
	_, err = newSender(t, cfg, "").Send(ctxT(t), reminder(1, "ada@example.com"))
	requireKind(t, err, provider.Retryable, "tls")
}

// Opportunistic STARTTLS, chosen explicitly, talks plain text to a server
// that does not offer it; AUTH PLAIN is allowed to localhost.
func TestOpportunisticTLSAndAuth(t *testing.T) {
	t.Parallel()
	mp := testenv.Mailpit(t, "--smtp-auth-accept-any", "--smtp-auth-allow-insecure")
	url := "smtp://user:s%40cret@" + mp.SMTPAddr() + "?from=reminders@nudge.test&auth=plain&tls=starttls-opportunistic"
	cfg, err := email.ParseSMTPURL(url)
	require.NoError(t, err)
	require.Equal(t, email.TLSOpportunistic, cfg.TLS)
	require.Equal(t, "s@cret", cfg.Password)
	ctx := ctxT(t)
	_, err = newSender(t, cfg, "").Send(ctx, reminder(1, "ada@example.com"))
	require.NoError(t, err)
	_, err = mp.WaitForCount(ctx, 1)
	require.NoError(t, err)
}

// selfSignedCert writes a certificate and key for 127.0.0.1 and returns their
// paths.
func selfSignedCert(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	write(t, dir, "cert.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	write(t, dir, "key.pem", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	return certFile, keyFile
}

func TestTLSModes(t *testing.T) {
	t.Parallel()
	cert, key := selfSignedCert(t)
	tlsArgs := []string{"--smtp-tls-cert", cert, "--smtp-tls-key", key}
	cases := []struct {
		name     string
		extra    []string // Mailpit flags besides the certificate
		url      string   // %s is host:port
		wantCode string   // "" means delivered
	}{
		{"implicit TLS", []string{"--smtp-require-tls"}, "smtps://%s?insecure=1", ""},
		{"required STARTTLS", []string{"--smtp-require-starttls"}, "smtp://%s?tls=starttls&insecure=1", ""},
		{"opportunistic STARTTLS when offered", []string{"--smtp-require-starttls"}, "smtp://%s?tls=starttls-opportunistic&insecure=1", ""},
		{"the default requires STARTTLS", []string{"--smtp-require-starttls"}, "smtp://%s?insecure=1", ""},
		{"unverified certificate is refused", []string{"--smtp-require-tls"}, "smtps://%s?tls=tls", "tls"},
		{"plain text to a server that requires STARTTLS", []string{"--smtp-require-starttls"}, "smtp://%s?tls=none", "smtp_530"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mp := testenv.Mailpit(t, append(tlsArgs, tc.extra...)...)
			cfg, err := email.ParseSMTPURL(fmt.Sprintf(tc.url, mp.SMTPAddr()) + "&from=reminders@nudge.test")
			require.NoError(t, err)
			ctx := ctxT(t)
			_, err = newSender(t, cfg, "").Send(ctx, reminder(1, "ada@example.com"))
			if tc.wantCode != "" {
				requireKind(t, err, provider.Retryable, tc.wantCode)
				return
			}
			require.NoError(t, err)
			_, err = mp.WaitForCount(ctx, 1)
			require.NoError(t, err)
		})
	}
}

// A relay refusing AUTH says nothing about the reminder: retry, do not fail it.
func TestAuthFailureIsRetryable(t *testing.T) {
	t.Parallel()
	mp := testenv.Mailpit(t, "--smtp-auth-accept-any", "--smtp-auth-allow-insecure")
	ctx := ctxT(t)
	require.NoError(t, mp.SetChaos(ctx, testenv.MailpitChaos{Authentication: testenv.MailpitChaosTrigger{ErrorCode: 535, Probability: 100}}))
	cfg, err := email.ParseSMTPURL("smtp://user:pw@" + mp.SMTPAddr() + "?tls=none&from=reminders@nudge.test")
	require.NoError(t, err)
	_, err = newSender(t, cfg, "").Send(ctx, reminder(1, "ada@example.com"))
	requireKind(t, err, provider.Retryable, "smtp_535")
	require.NotContains(t, err.Error(), "pw@", "errors must not leak the password")
}

// Pooled connections the server has dropped are redialed without failing the
// send.
func TestRedialsDroppedConnections(t *testing.T) {
	t.Parallel()
	mp := testenv.Mailpit(t)
	proxy := newProxy(t, mp.SMTPAddr())
	cfg, err := email.ParseSMTPURL("smtp://" + proxy.addr() + "?tls=none&from=reminders@nudge.test")
	require.NoError(t, err)
	s := newSender(t, cfg, "")
	ctx := ctxT(t)

	for i := range 3 {
		_, err := s.Send(ctx, reminder(int64(i), "ada@example.com"))
		require.NoError(t, err)
	}
	require.Equal(t, 1, proxy.accepted(), "sequential sends reuse one connection")

	proxy.dropAll()
	_, err = s.Send(ctx, reminder(10, "ada@example.com"))
	require.NoError(t, err)
	require.Equal(t, 2, proxy.accepted())

	_, err = mp.WaitForCount(ctx, 4)
	require.NoError(t, err)
}

func TestSendAfterCloseIsRetryable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxT(t)
	_, err := b.sender.Send(ctx, reminder(1, "ada@example.com"))
	require.NoError(t, err)
	require.NoError(t, b.sender.Close())
	require.NoError(t, b.sender.Close())
	_, err = b.sender.Send(ctx, reminder(2, "ada@example.com"))
	requireKind(t, err, provider.Retryable, "closed")
	require.ErrorIs(t, err, email.ErrClosed)
}

func TestParseSMTPURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		url     string
		want    email.Config
		wantErr string
	}{
		// Issue 13, finding 9: smtp:// used to default to opportunistic
		// STARTTLS, which a man in the middle downgrades to plain text.
		{url: "smtp://mail.example.com", want: email.Config{Host: "mail.example.com", Port: 25, TLS: email.TLSStartTLS}},
		{url: "smtp://h?tls=starttls-opportunistic", want: email.Config{Host: "h", Port: 25, TLS: email.TLSOpportunistic}},
		{url: "smtp://127.0.0.1:1025?tls=none", want: email.Config{Host: "127.0.0.1", Port: 1025, TLS: email.TLSNone}},
		{url: "smtps://relay.example.com", want: email.Config{Host: "relay.example.com", Port: 465, TLS: email.TLSImplicit}},
		{url: "smtps://relay.example.com:2465?tls=tls", want: email.Config{Host: "relay.example.com", Port: 2465, TLS: email.TLSImplicit}},
		{url: "smtp://[::1]:587?tls=starttls", want: email.Config{Host: "::1", Port: 587, TLS: email.TLSStartTLS}},
		{url: "smtp://h?tls=opportunistic", want: email.Config{Host: "h", Port: 25, TLS: email.TLSOpportunistic}},
		{
			url: "smtp://bob:p%40ss%3Aword@mail.example.com:587?tls=STARTTLS&auth=LOGIN&from=Nudge+%3Cn%40example.com%3E&insecure=1&domain=ids.example.com&timeout=5s&pool=8",
			want: email.Config{
				Host: "mail.example.com", Port: 587, Username: "bob", Password: "p@ss:word",
				TLS: email.TLSStartTLS, Auth: "login", From: "Nudge <n@example.com>",
				InsecureSkipVerify: true, MessageIDDomain: "ids.example.com", Timeout: 5 * time.Second, PoolSize: 8,
			},
		},
		{url: "smtps://h?ca=/etc/nudge/ca.pem", want: email.Config{Host: "h", Port: 465, TLS: email.TLSImplicit, CAFile: "/etc/nudge/ca.pem"}},
		{url: "smtp://u:p@h?auth=cram-md5", want: email.Config{Host: "h", Port: 25, TLS: email.TLSStartTLS, Username: "u", Password: "p", Auth: "cram-md5"}},

		{url: "http://mail.example.com", wantErr: `scheme "http"`},
		{url: "mail.example.com:25", wantErr: `scheme "mail.example.com"`},
		{url: "smtp:mail.example.com", wantErr: "want smtp://host:port"},
		{url: "smtp://", wantErr: "missing host"},
		{url: "smtp://:25", wantErr: "missing host"},
		{url: "smtp://h:0", wantErr: `port "0"`},
		{url: "smtp://h:70000", wantErr: `port "70000"`},
		{url: "smtp://h:abc", wantErr: "invalid port"},
		{url: "smtp://h/path", wantErr: `unexpected path "/path"`},
		{url: "smtp://h?tls=ssl", wantErr: `tls="ssl"`},
		{url: "smtps://h?tls=none", wantErr: "contradicts smtps://"},
		{url: "smtp://h?from=not-an-address", wantErr: `from="not-an-address"`},
		{url: "smtp://u:p@h?auth=xoauth2", wantErr: `auth="xoauth2"`},
		{url: "smtp://h?auth=plain", wantErr: "needs user:pass@"},
		{url: "smtp://h?insecure=maybe", wantErr: `insecure="maybe"`},
		{url: "smtp://h?ca=", wantErr: "ca= needs a file name"},
		{url: "smtp://h?timeout=-1s", wantErr: `timeout="-1s"`},
		{url: "smtp://h?pool=0", wantErr: `pool="0"`},
		{url: "smtp://h?domain=a..b", wantErr: `domain="a..b"`},
		{url: "smtp://h?tsl=none", wantErr: `unknown parameter "tsl"`},
		{url: "smtp://h?tls=none&tls=tls", wantErr: `"tls" given 2 times`},
		{url: "smtp://:secret@h", wantErr: "empty user name"},
		// Issue 13, finding 4: a reserved character in the password put part
		// of it in the error (as a port, a path or a parameter name).
		{url: "smtp://u:se/cret@h:587", wantErr: "u:xxxxx@h:587"},
		{url: "smtp://u:25/secret@h:587", wantErr: "an \"@\" after the host"},
		{url: "smtp://u:25?secret@h:587", wantErr: "an \"@\" after the host"},
		{url: "smtp://u:25#secret@h:587", wantErr: "an \"@\" after the host"},
		{url: "smtp://u:se%cret@h", wantErr: "percent-encode"},
		{url: "smtp://u:se:cr@et@h:587/x", wantErr: `unexpected path "/x"`},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			t.Parallel()
			got, err := email.ParseSMTPURL(tc.url)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.NotContains(t, err.Error(), "secret", "errors must not leak the password")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	tmpl, err := email.LoadTemplates("")
	require.NoError(t, err)
	for _, tc := range []struct {
		cfg     email.Config
		wantErr string
	}{
		{email.Config{From: "a@b.c"}, "host is required"},
		{email.Config{Host: "h"}, "from address is required"},
		{email.Config{Host: "h", From: "nope"}, `from address "nope"`},
		{email.Config{Host: "h", From: "a@b.c", TLS: "ssl"}, `TLS mode "ssl"`},
		{email.Config{Host: "h", From: "a@b.c", Auth: "plain"}, "without a username"},
		{email.Config{Host: "h", From: "a@b.c", MessageIDDomain: "bad domain"}, "message ID domain"},
	} {
		_, err := email.New(tc.cfg, tmpl)
		require.ErrorContains(t, err, tc.wantErr)
	}
	_, err = email.New(email.Config{Host: "h", From: "a@b.c"}, nil)
	require.ErrorContains(t, err, "templates are required")
	s, err := email.New(email.Config{Host: "h", From: "Nudge <a@b.c>"}, tmpl)
	require.NoError(t, err)
	require.NoError(t, s.Close())
}

func TestMessageID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ key, want string }{
		{"rem-42", "rem-42@d.test"},
		{"01HZX.3", "01HZX.3@d.test"},
		{"tenant:42:1", "tenant=3A42=3A1@d.test"},
		{"a b<c>@d", "a=20b=3Cc=3E=40d@d.test"},
		{"x=3A", "x=3D3A@d.test"}, // "=" is escaped, so this differs from "x:"
		{".a..b.", "=2Ea.=2Eb=2E@d.test"},
	} {
		require.Equal(t, tc.want, email.MessageID(tc.key, "d.test"), "key %q", tc.key)
	}
}

func TestEmbeddedTemplatesTolerateMissingData(t *testing.T) {
	t.Parallel()
	tmpl, err := email.LoadTemplates("")
	require.NoError(t, err)
	require.Equal(t, []string{"certificate-cleanup", "course-expiry", "subscription-renewal"}, tmpl.Names())
	for _, name := range tmpl.Names() {
		for _, deadline := range []time.Time{{}, time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC)} {
			r, err := tmpl.Render(name, map[string]any{"reminder_id": int64(1), "tenant": "t", "deadline": deadline})
			require.NoError(t, err, name)
			for _, part := range []string{r.Subject, r.Text, r.HTML} {
				require.NotEmpty(t, part, name)
				require.NotContains(t, part, "<no value>", name)
			}
			require.NotContains(t, r.Subject, "\n")
		}
	}
	r, err := tmpl.Render("subscription-renewal", map[string]any{"plan": "Pro", "deadline": time.Time{}})
	require.NoError(t, err)
	require.Equal(t, "Your Pro renews soon", r.Subject)
	r, err = tmpl.Render("certificate-cleanup", map[string]any{"certificate": "*.example.com", "deadline": time.Time{}})
	require.NoError(t, err)
	require.Equal(t, "Certificate *.example.com needs attention", r.Subject)
}

func TestLoadTemplatesOverridesAndAdds(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir, "course-expiry.subject.tmpl", "Last call: {{.course}}")
	write(t, dir, "welcome.subject.tmpl", "Welcome {{.name}}")
	write(t, dir, "welcome.txt.tmpl", "Hi {{.name}}")
	write(t, dir, "README.md", "not a template, ignored")

	tmpl, err := email.LoadTemplates(dir)
	require.NoError(t, err)
	require.Equal(t, []string{"certificate-cleanup", "course-expiry", "subscription-renewal", "welcome"}, tmpl.Names())

	r, err := tmpl.Render("course-expiry", map[string]any{"course": "Go", "deadline": time.Time{}})
	require.NoError(t, err)
	require.Equal(t, "Last call: Go", r.Subject)
	require.Contains(t, r.Text, "Your access to Go expires soon", "the embedded body still applies")

	r, err = tmpl.Render("welcome", map[string]any{"name": "Ada"})
	require.NoError(t, err)
	require.Equal(t, email.Rendered{Subject: "Welcome Ada", Text: "Hi Ada"}, r, "no HTML part without an html template")
}

func TestLoadTemplatesErrorsNameTheFile(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		files   map[string]string
		wantErr string
	}{
		{"parse error", map[string]string{"course-expiry.html.tmpl": "<p>{{.course</p>"}, "course-expiry.html.tmpl"},
		{"parse error in a new template", map[string]string{"x.subject.tmpl": "s", "x.txt.tmpl": "{{if}}"}, "x.txt.tmpl"},
		{"unknown suffix", map[string]string{"x.body.tmpl": "b"}, "x.body.tmpl: name must end in"},
		{"missing text body", map[string]string{"x.subject.tmpl": "s"}, "missing x.txt.tmpl"},
		{"missing subject", map[string]string{"x.txt.tmpl": "t", "x.html.tmpl": "h"}, "missing x.subject.tmpl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for f, body := range tc.files {
				write(t, dir, f, body)
			}
			_, err := email.LoadTemplates(dir)
			require.ErrorContains(t, err, tc.wantErr)
			if tc.name == "parse error" {
				require.ErrorContains(t, err, filepath.Join(dir, "course-expiry.html.tmpl"), "the full path an operator can open")
			}
		})
	}
	_, err := email.LoadTemplates(filepath.Join(t.TempDir(), "missing"))
	require.ErrorContains(t, err, "reading template directory")
}

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600))
}

// proxy forwards TCP to target and can drop every connection, as a relay
// restarting or an idle timeout would.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
	n     int
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		_ = ln.Close()
		p.dropAll()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.n++
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(up, c); _ = up.Close() })
		p.wg.Go(func() { _, _ = io.Copy(c, up); _ = c.Close() })
	}
}

func (p *proxy) dropAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}
