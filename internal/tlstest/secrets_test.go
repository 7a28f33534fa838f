package tlstest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/testenv"
)

// requireNoSecrets fails if out holds any configured secret, in any form.
func requireNoSecrets(t *testing.T, out string) {
	t.Helper()
	for _, s := range secrets() {
		require.NotContains(t, out, s, "a secret was printed")
	}
}

// urlPassword is p as the password of a URL's user information.
func urlPassword(p string) string { return url.UserPassword("u", p).String()[2:] }

// Every binary runs over verified TLS: nudgectl migrates and declares the
// topology, the dispatcher publishes, the email worker sends over STARTTLS
// with SMTP AUTH, the SMS worker with its bearer token; nudgectl stats reads
// the dead-letter depths. Then every log line, every metric and nudgectl's
// output are searched for each secret.
func TestFullRunNeverPrintsSecrets(t *testing.T) {
	s := setup(t)
	s.postgres(t)
	s.rabbitmq(t)
	bins := testenv.Binaries(t)
	ctx := ctxT(t)

	cert, key, err := s.ca.Server("smtp-run")
	require.NoError(t, err)
	mp := testenv.Mailpit(t, "--smtp-tls-cert", cert, "--smtp-tls-key", key, "--smtp-require-starttls", "--smtp-auth-accept-any")
	ports, err := testenv.FreePorts(4)
	require.NoError(t, err)
	smsAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	fake := testenv.Start(t, bins, "fake-sms", []string{"NUDGE_FAKE_SMS_TOKEN=" + smsToken}, "--listen", smsAddr)

	dbURL := s.dbURL("nudge_run", s.ca)
	env := []string{
		"NUDGE_DATABASE_URL=" + dbURL,
		"NUDGE_AMQP_URL=" + s.amqpURL(s.ca),
		"NUDGE_SIGNING_KEYS=tls:" + signingSecret,
		"NUDGE_QUEUE_PREFIX=run",
		"NUDGE_SMTP_URL=" + fmt.Sprintf("smtp://user:%s@%s?ca=%s&from=reminders@nudge.test", urlPassword(smtpPassword), mp.SMTPAddr(), url.QueryEscape(s.ca.File)),
		"NUDGE_SMS_URL=http://" + smsAddr,
		"NUDGE_SMS_TOKEN=" + smsToken,
		"NUDGE_LOG_FORMAT=json", "NUDGE_LOG_LEVEL=debug",
	}
	var outputs []*testenv.Proc
	run := func(bin string, args ...string) string {
		p := testenv.Start(t, bins, bin, env, args...)
		outputs = append(outputs, p)
		code, _ := p.Wait(t, time.Minute)
		require.Equal(t, 0, code, "%s %v:\n%s", bin, args, p.Output())
		return p.Output()
	}
	// A fresh install: no previous release runs, so the after-rollout steps
	// too (README); this release's dispatcher needs schema 38.
	run("nudgectl", "migrate", "--declare-topology", "--after-rollout")

	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for i, ch := range []string{"email", "sms"} {
		_, err := conn.Exec(ctx, `SELECT nudge_schedule('acme', $1, $2, $3, 'course-expiry', '{"course": "Go 101"}', now(), now() + interval '1 hour')`,
			fmt.Sprintf("tls-%d", i), ch, map[string]string{"email": "ada@example.com", "sms": "+15550100"}[ch])
		require.NoError(t, err)
	}

	var metricsBodies []string
	long := map[string]int{"email-worker": ports[1], "sms-worker": ports[2], "reconciler": ports[3]}
	for bin, port := range long {
		p := testenv.Start(t, bins, bin, append(env, fmt.Sprintf("NUDGE_LISTEN=127.0.0.1:%d", port)))
		outputs = append(outputs, p)
		waitReady(t, ctx, p, port)
	}
	run("dispatcher")
	require.Eventually(t, func() bool {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM reminder_state WHERE state = 'delivered'`).Scan(&n)
		return err == nil && n == 2
	}, 30*time.Second, 100*time.Millisecond, "both reminders delivered")
	_, err = mp.WaitForCount(ctx, 1)
	require.NoError(t, err)

	for _, port := range long {
		metricsBodies = append(metricsBodies, get(t, ctx, fmt.Sprintf("http://127.0.0.1:%d/metrics", port)))
	}
	stats := run("nudgectl", "stats", "--amqp-url", s.amqpURL(s.ca))
	require.Contains(t, stats, "dead-letter")

	all := strings.Join(metricsBodies, "\n")
	for _, p := range append(outputs, fake) {
		all += "\n" + p.Output()
	}
	require.Contains(t, all, `"component":"email-worker"`, "the logs were captured")
	requireNoSecrets(t, all)
}

// Issue 13, finding 4: each binary given URLs whose passwords hold reserved
// characters unencoded stops with an error that shows none of them.
func TestBadURLsNeverPrintSecrets(t *testing.T) {
	t.Parallel()
	bins := testenv.Binaries(t)
	bad := map[string]string{
		"NUDGE_DATABASE_URL": "postgres://nudge:" + dbPassword + "@db.example.com:5432/nudge?sslmode=verify-full",
		"NUDGE_AMQP_URL":     "amqps://nudge:" + mqPassword + "@mq.example.com:5671/nudge",
		"NUDGE_SMTP_URL":     "smtp://nudge:" + smtpPassword + "@smtp.example.com:587",
		"NUDGE_SMS_URL":      "https://nudge:" + smsToken + "@sms.example.com",
	}
	good := []string{
		"NUDGE_DATABASE_URL=postgres://127.0.0.1:1/nudge", "NUDGE_AMQP_URL=amqp://127.0.0.1:1/",
		"NUDGE_SIGNING_KEYS=tls:" + signingSecret, "NUDGE_SMTP_URL=smtp://127.0.0.1:1?tls=none",
		"NUDGE_SMS_URL=http://127.0.0.1:1", "NUDGE_LISTEN=",
	}
	cases := []struct {
		bin  string
		args []string
		vars []string
	}{
		{"nudgectl", []string{"migrate"}, []string{"NUDGE_DATABASE_URL"}},
		{"nudgectl", []string{"stats", "--amqp-url", bad["NUDGE_AMQP_URL"]}, nil},
		{"nudgectl", []string{"dlq", "list"}, []string{"NUDGE_AMQP_URL"}},
		{"dispatcher", nil, []string{"NUDGE_DATABASE_URL"}},
		{"dispatcher", nil, []string{"NUDGE_AMQP_URL"}},
		{"reconciler", nil, []string{"NUDGE_DATABASE_URL"}},
		{"reconciler", nil, []string{"NUDGE_AMQP_URL"}},
		{"email-worker", nil, []string{"NUDGE_DATABASE_URL"}},
		{"email-worker", nil, []string{"NUDGE_AMQP_URL"}},
		{"email-worker", nil, []string{"NUDGE_SMTP_URL"}},
		{"sms-worker", nil, []string{"NUDGE_AMQP_URL"}},
		{"sms-worker", nil, []string{"NUDGE_SMS_URL"}},
	}
	for _, tc := range cases {
		t.Run(tc.bin+" "+strings.Join(append(tc.args, tc.vars...), " "), func(t *testing.T) {
			t.Parallel()
			env := append([]string{}, good...)
			for _, v := range tc.vars {
				env = append(env, v+"="+bad[v])
			}
			p := testenv.Start(t, bins, tc.bin, env, tc.args...)
			code, _ := p.Wait(t, 30*time.Second)
			require.NotEqual(t, 0, code, p.Output())
			require.Contains(t, p.Output(), "xxxxx", "the error shows the redacted URL")
			requireNoSecrets(t, p.Output())
		})
	}
}

func waitReady(t *testing.T, ctx context.Context, p *testenv.Proc, port int) {
	t.Helper()
	require.Eventually(t, func() bool {
		require.False(t, p.Exited(), "%s exited:\n%s", p.Name, p.Output())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/readyz", port), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "%s ready", p.Name)
}

func get(t *testing.T, ctx context.Context, u string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}
