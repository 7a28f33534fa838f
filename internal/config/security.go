package config

// Transport security and secrets, checked once at start-up (issue 13): every
// URL a command was given is parsed with its password hidden from errors,
// a connection to a host other than loopback must use verified TLS unless
// --allow-insecure-tls says otherwise, and signing keys must be real keys.
// BindEnv (so config.Execute) runs CheckFlags after the flags and the
// environment are read, so each binary and each nudgectl subcommand is
// covered by the flags it has, without a call of its own.

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/email"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/redact"
)

// DefaultProbeListen is where a long-running binary serves /healthz, /readyz
// and /metrics unless --listen says otherwise: loopback only, so a process
// started by hand does not expose its metrics to the network. Containers set
// --listen=:8080 (the Kubernetes manifests and docker-compose.yml do).
const DefaultProbeListen = "127.0.0.1:8080"

// MinSigningSecret is the shortest signing secret a binary accepts, in
// bytes: the size of the HMAC-SHA256 output, as RFC 2104 recommends.
const MinSigningSecret = 32

// ErrInsecureTransport is wrapped by every refusal of plain text or
// unverified TLS to a host that is not loopback.
var ErrInsecureTransport = errors.New("refusing plain text or unverified TLS to a host that is not loopback")

// registerSecurity adds --allow-insecure-tls.
func (c *Common) registerSecurity(fs *pflag.FlagSet) {
	if fs.Lookup(allowInsecureFlag) != nil {
		return
	}
	fs.BoolVar(&c.AllowInsecureTLS, allowInsecureFlag, false,
		"allow plain text or unverified TLS to hosts that are not loopback (PostgreSQL without sslmode=verify-full, amqp://, "+
			"SMTP tls=none or insecure=1, http:// SMS provider); development only")
}

const allowInsecureFlag = "allow-insecure-tls"

// CheckFlags checks the values of the flags in fs that name a connection or
// a secret (--database-url, --amqp-url, --smtp-url, --sms-url,
// --signing-keys), whichever fs has; empty values are skipped (a required
// flag is reported by the code that needs it). --allow-insecure-tls, when fs
// has it, relaxes the transport rules.
func CheckFlags(fs *pflag.FlagSet) error {
	allow := false
	if f := fs.Lookup(allowInsecureFlag); f != nil {
		allow = f.Value.String() == "true"
	}
	checks := []struct {
		flag  string
		check func(string, bool) error
	}{
		{"database-url", CheckDatabaseURL},
		{"amqp-url", CheckAMQPURL},
		{"smtp-url", CheckSMTPURL},
		{"sms-url", CheckSMSURL},
		{"signing-keys", func(v string, _ bool) error { return CheckSigningKeys(v) }},
	}
	for _, c := range checks {
		f := fs.Lookup(c.flag)
		if f == nil || f.Value.String() == "" {
			continue
		}
		if err := c.check(f.Value.String(), allow); err != nil {
			return fmt.Errorf("--%s: %w", c.flag, err)
		}
	}
	return nil
}

// insecure is the refusal for raw (shown redacted) to host.
func insecure(raw, host, what, fix string) error {
	return fmt.Errorf("%w: %s: %s to %s; %s, or pass --%s (development only)",
		ErrInsecureTransport, redact.URL(raw), what, host, fix, allowInsecureFlag)
}

// CheckDatabaseURL parses a PostgreSQL connection string (URL or
// keyword/value, PG* variables applied) with errors that never show the
// password, and unless allowInsecure refuses a host that is not loopback
// without sslmode=verify-full: any other mode either talks plain text
// (disable, allow, prefer when the server has no TLS) or accepts any
// certificate (require) or any name on it (verify-ca).
func CheckDatabaseURL(raw string, allowInsecure bool) error {
	var pc *pgxpool.Config
	err := redact.Check(raw, func(s string) (err error) {
		pc, err = pgxpool.ParseConfig(s)
		return err
	})
	if err != nil {
		return err
	}
	cfg := pc.ConnConfig
	if allowInsecure {
		return nil
	}
	type target struct {
		host     string
		verified bool
	}
	targets := []target{{cfg.Host, cfg.TLSConfig != nil && !cfg.TLSConfig.InsecureSkipVerify}}
	for _, fb := range cfg.Fallbacks {
		targets = append(targets, target{fb.Host, fb.TLSConfig != nil && !fb.TLSConfig.InsecureSkipVerify})
	}
	for _, t := range targets {
		if !t.verified && !IsLocal(t.host) {
			return insecure(raw, t.host, "a connection without verified TLS",
				"set sslmode=verify-full (with sslrootcert=CA-FILE unless the server's CA is in the system's roots)")
		}
	}
	return nil
}

// CheckAMQPURL parses a RabbitMQ URL with errors that never show the
// password, and unless allowInsecure refuses amqp:// (plain text) to a host
// that is not loopback. amqps:// always verifies the broker's certificate
// (against cacertfile= or the system's roots); amqp091-go has no way to turn
// that off.
func CheckAMQPURL(raw string, allowInsecure bool) error {
	if _, err := redact.Parse(raw); err != nil {
		return err
	}
	var uri amqp.URI
	err := redact.Check(raw, func(s string) (err error) {
		uri, err = amqp.ParseURI(s)
		return err
	})
	if err != nil {
		return err
	}
	if !allowInsecure && uri.Scheme != "amqps" && !IsLocal(uri.Host) {
		return insecure(raw, uri.Host, "plain AMQP", "use amqps:// (port 5671)")
	}
	return nil
}

// CheckSMTPURL parses an SMTP URL (email.ParseSMTPURL, whose errors never
// show the password) and unless allowInsecure refuses tls=none and
// insecure=1 to a relay that is not loopback. tls=starttls-opportunistic is
// the operator's explicit choice and is allowed.
func CheckSMTPURL(raw string, allowInsecure bool) error {
	cfg, err := email.ParseSMTPURL(raw)
	if err != nil {
		return err
	}
	if allowInsecure || IsLocal(cfg.Host) {
		return nil
	}
	switch {
	case cfg.TLS == email.TLSNone:
		return insecure(raw, cfg.Host, "tls=none (plain text)", "use tls=starttls or smtps://")
	case cfg.InsecureSkipVerify:
		return insecure(raw, cfg.Host, "insecure=1 (any certificate accepted)", "drop insecure=1 and trust the relay's CA")
	}
	return nil
}

// CheckSMSURL parses the SMS provider's URL with errors that never show user
// info or a token, and unless allowInsecure refuses http:// (the bearer token
// in plain text) to a host that is not loopback.
func CheckSMSURL(raw string, allowInsecure bool) error {
	u, err := redact.Parse(raw)
	if err != nil {
		return err
	}
	if !allowInsecure && u.Scheme == "http" && !IsLocal(u.Hostname()) {
		return insecure(raw, u.Hostname(), "plain HTTP", "use https://")
	}
	return nil
}

// placeholders are what example configurations put where a secret belongs.
var placeholders = []string{"CHANGE-ME", "CHANGEME", "CHANGE_ME", "PLACEHOLDER", "EXAMPLE"}

// CheckSigningKeys checks KID:SECRET[,KID:SECRET...] as message.ParseKeys
// does, and refuses secrets shorter than MinSigningSecret bytes and the
// placeholders of the example manifests (k1:CHANGE-ME-...). Errors name the
// key id, never the secret.
func CheckSigningKeys(spec string) error {
	if _, err := message.ParseKeys(spec); err != nil {
		return err
	}
	for part := range strings.SplitSeq(spec, ",") {
		kid, secret, _ := strings.Cut(strings.TrimSpace(part), ":")
		if kid == "" {
			continue
		}
		upper := strings.ToUpper(secret)
		for _, p := range placeholders {
			if strings.Contains(upper, p) {
				return fmt.Errorf("signing key %q is a placeholder (it contains %q): generate one, e.g. KID:$(openssl rand -base64 32)", kid, p)
			}
		}
		// A channel key (KID@CHANNEL:HEX) is 32 bytes by construction; the
		// shipped example's placeholder is one of all zeros.
		if strings.Contains(kid, "@") && strings.Trim(secret, "0") == "" {
			return fmt.Errorf("signing key %q is a placeholder (all zeros): derive it with nudgectl keys derive --channel", kid)
		}
		if len(secret) < MinSigningSecret {
			return fmt.Errorf("signing key %q: secret is %d bytes, want at least %d (e.g. KID:$(openssl rand -base64 32))", kid, len(secret), MinSigningSecret)
		}
	}
	return nil
}

// IsLocal reports whether host is this machine: a loopback address, the name
// localhost, or a Unix socket directory (PostgreSQL's host=/run/postgresql).
func IsLocal(host string) bool {
	if host == "localhost" || strings.HasPrefix(host, "/") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
