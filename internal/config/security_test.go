package config_test

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/internal/redact"
)

// Each case is checked without and with --allow-insecure-tls: wantStrict is
// the error (substring) without it, "" for accepted; the flag only ever
// lifts ErrInsecureTransport.
type transportCase struct {
	raw, wantStrict string
}

func checkTransport(t *testing.T, check func(string, bool) error, cases []transportCase) {
	t.Helper()
	for _, tc := range cases {
		strict := check(tc.raw, false)
		if tc.wantStrict == "" {
			require.NoError(t, strict, tc.raw)
		} else {
			require.ErrorContains(t, strict, tc.wantStrict, tc.raw)
		}
		err := check(tc.raw, true)
		if strict == nil || errors.Is(strict, config.ErrInsecureTransport) {
			require.NoError(t, err, "%s with --allow-insecure-tls", tc.raw)
		} else {
			require.Error(t, err, "%s with --allow-insecure-tls", tc.raw)
		}
	}
}

// Issue 13, finding 9: a database URL without verified TLS was accepted for
// any host (and the built-in default had sslmode=disable).
func TestCheckDatabaseURL(t *testing.T) {
	t.Parallel()
	checkTransport(t, config.CheckDatabaseURL, []transportCase{
		{config.DefaultDatabaseURL, ""},
		{"postgres://u:pw@127.0.0.1:5432/db?sslmode=disable", ""},
		{"postgres://u@localhost/db", ""},
		{"postgres://u@[::1]:5432/db?sslmode=prefer", ""},
		{"host=/run/postgresql dbname=nudge sslmode=disable", ""},
		{"postgres://u:pw@db.example.com/nudge?sslmode=verify-full", ""},
		{"postgres://u:pw@db.example.com/nudge", "not loopback"},
		{"postgres://u:pw@db.example.com/nudge?sslmode=disable", "not loopback"},
		{"postgres://u:pw@db.example.com/nudge?sslmode=require", "not loopback"},
		{"postgres://u:pw@db.example.com/nudge?sslmode=verify-ca", "not loopback"},
		{"postgres://u:pw@127.0.0.1,db.example.com/nudge?sslmode=prefer", "to db.example.com"},
		{"host=db.example.com password=pw sslmode=allow", "not loopback"},
		{"postgres://u:pw@db.example.com/nudge?sslmode=bogus", "sslmode"},
	})
	err := config.CheckDatabaseURL("postgres://u:Qj/Kx@db.example.com/nudge", false)
	require.NotContains(t, err.Error(), "Qj")
	require.NotContains(t, err.Error(), "Kx")
	err = config.CheckDatabaseURL("postgres://u:Qj@db.example.com/nudge?sslmode=require", false)
	require.ErrorIs(t, err, config.ErrInsecureTransport)
	require.Contains(t, err.Error(), "u:xxxxx@db.example.com")
	require.NotContains(t, err.Error(), "Qj")
}

// Issue 13, finding 9: plain AMQP to any host.
func TestCheckAMQPURL(t *testing.T) {
	t.Parallel()
	checkTransport(t, config.CheckAMQPURL, []transportCase{
		{config.DefaultAMQPURL, ""},
		{"amqp://u:pw@localhost/", ""},
		{"amqps://u:pw@mq.example.com:5671/nudge", ""},
		{"amqps://mq.example.com/nudge?cacertfile=/ca.pem&certfile=/c.pem&keyfile=/k.pem&auth_mechanism=external", ""},
		{"amqp://u:pw@mq.example.com:5672/nudge", "not loopback"},
		{"http://mq.example.com/", "scheme"},
		{"amqp://u:Qj/Kx@mq.example.com/", "percent-encode"},
	})
}

// Issue 13, finding 9: insecure=1 switched certificate checks off for any
// relay.
func TestCheckSMTPURL(t *testing.T) {
	t.Parallel()
	checkTransport(t, config.CheckSMTPURL, []transportCase{
		{"smtp://127.0.0.1:1025?tls=none", ""},
		{"smtp://localhost:1025?insecure=1", ""},
		{"smtp://u:pw@smtp.example.com:587", ""},
		{"smtps://u:pw@smtp.example.com", ""},
		{"smtp://smtp.example.com:25?tls=starttls-opportunistic", ""},
		{"smtp://u:pw@smtp.example.com:587?insecure=1", "not loopback"},
		{"smtps://smtp.example.com?insecure=true", "not loopback"},
		{"smtp://smtp.example.com:25?tls=none", "not loopback"},
		{"smtp://smtp.example.com:25?tls=bogus", "tls="},
	})
}

func TestCheckSMSURL(t *testing.T) {
	t.Parallel()
	checkTransport(t, config.CheckSMSURL, []transportCase{
		{"http://127.0.0.1:9025", ""},
		{"https://sms.example.com/api", ""},
		{"http://sms.example.com", "not loopback"},
		{"https://u:Qj/Kx@sms.example.com", "percent-encode"},
	})
}

// Issue 13, finding 9: the placeholder key of secret.example.yaml was
// accepted, and so was any key of 16 bytes.
func TestCheckSigningKeys(t *testing.T) {
	t.Parallel()
	good := "k1:" + strings.Repeat("a", config.MinSigningSecret)
	for _, tc := range []struct{ spec, want string }{
		{good, ""},
		{"k2:" + strings.Repeat("b", 44) + "," + good, ""},
		{"k1:CHANGE-ME-use-32-random-bytes-base64", `"k1" is a placeholder`},
		{"dev:change-me-0123456789abcdef0123456789abcdef", `"dev" is a placeholder`},
		{good + ",old:0123456789abcdef0123", `"old": secret is 20 bytes, want at least 32`},
		{"k1", "want KID:SECRET"},
		{"k1@sms:" + strings.Repeat("ab", 32), ""},
		{"k1@sms:" + strings.Repeat("0", 64), `"k1@sms" is a placeholder (all zeros)`},
	} {
		err := config.CheckSigningKeys(tc.spec)
		if tc.want == "" {
			require.NoError(t, err, tc.spec)
			continue
		}
		require.ErrorContains(t, err, tc.want, tc.spec)
		require.NotContains(t, err.Error(), "0123456789abcdef0123", "never the secret")
	}
}

func TestIsLocal(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]bool{
		"localhost": true, "127.0.0.1": true, "127.9.9.9": true, "::1": true, "[::1]": true,
		"/run/postgresql": true, "postgres": false, "10.0.0.1": false, "": false, "localhost.example.com": false,
	} {
		require.Equal(t, want, config.IsLocal(host), host)
	}
}

// BindEnv runs the checks before any nudgectl command, with the flag or its
// variable (NUDGE_ALLOW_INSECURE_TLS) lifting the transport rule.
func TestBindEnvChecksURLs(t *testing.T) {
	run := func(args ...string) error {
		cmd := ctl.Command()
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		config.BindEnv(cmd)
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.Execute()
		require.NotContains(t, out.String(), "Qj")
		return err
	}
	remote := "postgres://u:Qj@db.invalid/nudge?sslmode=disable&connect_timeout=1"
	err := run("stats", "--database-url", remote)
	require.ErrorIs(t, err, config.ErrInsecureTransport)
	require.ErrorContains(t, err, "--database-url")
	require.NotContains(t, err.Error(), "Qj")

	// Allowed: it gets as far as connecting (and db.invalid never resolves).
	err = run("stats", "--database-url", remote, "--allow-insecure-tls")
	require.Error(t, err)
	require.NotErrorIs(t, err, config.ErrInsecureTransport)
	t.Setenv("NUDGE_ALLOW_INSECURE_TLS", "true")
	err = run("stats", "--database-url", remote)
	require.NotErrorIs(t, err, config.ErrInsecureTransport)
	t.Setenv("NUDGE_ALLOW_INSECURE_TLS", "false")

	// Issue 13, finding 4: nudgectl stats printed an AMQP URL whose password
	// holds "/" whole.
	err = run("stats", "--amqp-url", "amqp://u:Qj/Kx@127.0.0.1:5672/")
	require.ErrorIs(t, err, redact.ErrInvalid)
	require.ErrorContains(t, err, "--amqp-url")
	require.NotContains(t, err.Error(), "Qj")
	require.NotContains(t, err.Error(), "Kx")
}

// Issue 13, finding 9: probes listened on every interface by default.
func TestDefaultProbeListenIsLoopback(t *testing.T) {
	t.Parallel()
	host, port, err := net.SplitHostPort(config.DefaultProbeListen)
	require.NoError(t, err)
	require.True(t, config.IsLocal(host), config.DefaultProbeListen)
	require.Equal(t, "8080", port, "the port the manifests and docs name")
}
