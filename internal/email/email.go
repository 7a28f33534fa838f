// Package email delivers reminders over SMTP. It exists so that a worker sees
// an SMTP relay as just another provider.Sender: templates are rendered at send
// time (so a fixed template reaches reminders already queued), every attempt at
// one reminder carries the same Message-ID (so a retry after an unknown outcome
// shows up in the mail sink as a countable duplicate rather than a new mail),
// and SMTP failures are classified into retryable and permanent ones, which is
// all the worker's retry decision depends on.
//
// SMTP connections are pooled: dialing, EHLO, STARTTLS and AUTH cost several
// round trips, far more than sending one short message.
package email

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/mail"
	"net/textproto"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	gomail "github.com/wneessen/go-mail"
	"github.com/wneessen/go-mail/smtp"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/redact"
)

// TLSMode says how the connection to the SMTP server is encrypted.
type TLSMode string

const (
	// TLSOpportunistic upgrades with STARTTLS if the server offers it and
	// continues in plain text if it does not, so anyone on the path can
	// downgrade it. Only by explicit choice (tls=starttls-opportunistic).
	TLSOpportunistic TLSMode = "starttls-opportunistic"
	// TLSStartTLS requires STARTTLS; a server that does not offer it fails the
	// connection. The default for smtp://.
	TLSStartTLS TLSMode = "starttls"
	// TLSImplicit speaks TLS from the first byte (SMTPS, usually port 465).
	TLSImplicit TLSMode = "tls"
	// TLSNone never encrypts. Only for local sinks such as Mailpit.
	TLSNone TLSMode = "none"
)

// Config describes one SMTP relay. ParseSMTPURL builds one from a URL.
type Config struct {
	// Host is the relay's host name or IP address. Required.
	Host string
	// Port is the relay's TCP port. Zero means 25, or 465 when TLS is
	// TLSImplicit.
	Port int
	// Username and Password authenticate with SMTP AUTH. An empty Username
	// means no authentication.
	Username, Password string
	// TLS is the encryption mode. Zero ("") means TLSStartTLS.
	TLS TLSMode
	// Auth is the SMTP AUTH mechanism: "plain", "login" or "cram-md5". Zero
	// ("") means "plain" when Username is set. PLAIN and LOGIN are refused
	// over an unencrypted connection except to localhost.
	Auth string
	// From is the envelope sender and From header, e.g.
	// "Nudge <reminders@example.com>". Required by New.
	From string
	// MessageIDDomain is the right-hand side of every Message-ID. Zero means
	// the domain of From.
	MessageIDDomain string
	// Timeout bounds dialing and each SMTP command. Zero means 15 seconds.
	Timeout time.Duration
	// InsecureSkipVerify disables verification of the server's certificate.
	// False (verify) unless the relay uses a self-signed certificate in a
	// test; the binaries refuse it for a relay that is not on loopback unless
	// started with --allow-insecure-tls (internal/config).
	InsecureSkipVerify bool
	// CAFile is a PEM file of the certificate authorities the relay's
	// certificate must chain to. Zero ("") means the system's roots.
	CAFile string
	// PoolSize is the most SMTP connections open at once; further concurrent
	// sends wait for a free connection. Zero means 4.
	PoolSize int
}

// Defaults applied by New to zero Config fields.
const (
	DefaultPort      = 25
	DefaultSMTPSPort = 465
	DefaultTimeout   = 15 * time.Second
	DefaultPoolSize  = 4
)

// Errors returned by Sender.
var (
	// ErrClosed means Send was called after Close. It is returned inside a
	// retryable *provider.Error: the reminder itself is fine.
	ErrClosed = errors.New("email sender closed")
)

// Headers set on every message, so a mail found in a sink or a bounce can be
// traced back to its reminder.
const (
	HeaderReminderID     = "X-Nudge-Reminder-Id"
	HeaderIdempotencyKey = "X-Nudge-Idempotency-Key"
	HeaderTenant         = "X-Nudge-Tenant"
)

// ParseSMTPURL parses
//
//	smtp://[user:pass@]host[:port][?tls=none|starttls|starttls-opportunistic|tls&from=...&auth=plain|login|cram-md5&ca=FILE&insecure=1]
//	smtps://[user:pass@]host[:port][?...]
//
// smtp:// defaults to port 25 and tls=starttls (STARTTLS required; plain text
// is refused); smtps:// means implicit TLS and defaults to port 465. User and password are URL-decoded. Further query
// parameters: domain (MessageIDDomain), timeout (a Go duration such as "10s")
// and pool (PoolSize). Unknown parameters are an error, so a typo does not
// silently fall back to a default.
func ParseSMTPURL(raw string) (Config, error) {
	var cfg Config
	// redact.Parse reports errors with the password hidden, and refuses a
	// URL where an unencoded reserved character in the password would put
	// part of it in the path or the query (and so in the errors below).
	u, err := redact.Parse(raw)
	if err != nil {
		return cfg, fmt.Errorf("parsing SMTP URL: %w", err)
	}
	switch u.Scheme {
	case "smtp":
		cfg.TLS = TLSStartTLS
	case "smtps":
		cfg.TLS = TLSImplicit
	default:
		return cfg, fmt.Errorf("parsing SMTP URL: scheme %q: want smtp or smtps", u.Scheme)
	}
	if u.Opaque != "" {
		return cfg, fmt.Errorf("parsing SMTP URL: want %s://host:port, not %s:%s", u.Scheme, u.Scheme, u.Opaque)
	}
	cfg.Host = u.Hostname()
	if cfg.Host == "" {
		return cfg, errors.New("parsing SMTP URL: missing host")
	}
	if p := u.Port(); p != "" {
		port, err := strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return cfg, fmt.Errorf("parsing SMTP URL: port %q: want 1-65535", p)
		}
		cfg.Port = port
	} else if cfg.TLS == TLSImplicit {
		cfg.Port = DefaultSMTPSPort
	} else {
		cfg.Port = DefaultPort
	}
	if u.Path != "" && u.Path != "/" {
		return cfg, fmt.Errorf("parsing SMTP URL: unexpected path %q", u.Path)
	}
	if u.User != nil {
		cfg.Username = u.User.Username()
		cfg.Password, _ = u.User.Password()
		if cfg.Username == "" {
			return cfg, errors.New("parsing SMTP URL: empty user name")
		}
	}

	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return cfg, fmt.Errorf("parsing SMTP URL query: %w", err)
	}
	for key, vals := range q {
		if len(vals) != 1 {
			return cfg, fmt.Errorf("parsing SMTP URL: parameter %q given %d times", key, len(vals))
		}
		v := vals[0]
		switch key {
		case "tls":
			mode := TLSMode(strings.ToLower(v))
			switch mode {
			case TLSNone, TLSStartTLS, TLSOpportunistic, TLSImplicit:
			case "opportunistic":
				mode = TLSOpportunistic
			default:
				return cfg, fmt.Errorf("parsing SMTP URL: tls=%q: want none, starttls, starttls-opportunistic or tls", v)
			}
			if u.Scheme == "smtps" && mode != TLSImplicit {
				return cfg, fmt.Errorf("parsing SMTP URL: tls=%q contradicts smtps:// (implicit TLS)", v)
			}
			cfg.TLS = mode
		case "from":
			if _, err := mail.ParseAddress(v); err != nil {
				return cfg, fmt.Errorf("parsing SMTP URL: from=%q: %w", v, err)
			}
			cfg.From = v
		case "auth":
			a := strings.ToLower(v)
			if _, err := authType(a); err != nil {
				return cfg, fmt.Errorf("parsing SMTP URL: auth=%q: %w", v, err)
			}
			cfg.Auth = a
		case "insecure":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return cfg, fmt.Errorf("parsing SMTP URL: insecure=%q: want 1, 0, true or false", v)
			}
			cfg.InsecureSkipVerify = b
		case "ca":
			if v == "" {
				return cfg, errors.New("parsing SMTP URL: ca= needs a file name")
			}
			cfg.CAFile = v
		case "domain":
			if !isDotAtom(v) {
				return cfg, fmt.Errorf("parsing SMTP URL: domain=%q: not a valid Message-ID domain", v)
			}
			cfg.MessageIDDomain = v
		case "timeout":
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return cfg, fmt.Errorf("parsing SMTP URL: timeout=%q: want a positive duration such as 10s", v)
			}
			cfg.Timeout = d
		case "pool":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return cfg, fmt.Errorf("parsing SMTP URL: pool=%q: want a positive integer", v)
			}
			cfg.PoolSize = n
		default:
			return cfg, fmt.Errorf("parsing SMTP URL: unknown parameter %q", key)
		}
	}
	if cfg.Auth != "" && cfg.Username == "" {
		return cfg, fmt.Errorf("parsing SMTP URL: auth=%s needs user:pass@ in the URL", cfg.Auth)
	}
	return cfg, nil
}

// Validate reports the first problem with cfg, after defaults are applied.
func (cfg Config) Validate() error {
	cfg = cfg.withDefaults()
	if cfg.Host == "" {
		return errors.New("host is required")
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return fmt.Errorf("port %d: want 1-65535", cfg.Port)
	}
	switch cfg.TLS {
	case TLSNone, TLSStartTLS, TLSOpportunistic, TLSImplicit:
	default:
		return fmt.Errorf("TLS mode %q: want none, starttls, starttls-opportunistic or tls", cfg.TLS)
	}
	if cfg.Username != "" {
		if _, err := authType(cfg.Auth); err != nil {
			return fmt.Errorf("auth %q: %w", cfg.Auth, err)
		}
	} else if cfg.Auth != "" {
		return fmt.Errorf("auth %q without a username", cfg.Auth)
	}
	if cfg.From == "" {
		return errors.New("from address is required")
	}
	if _, err := mail.ParseAddress(cfg.From); err != nil {
		return fmt.Errorf("from address %q: %w", cfg.From, err)
	}
	if !isDotAtom(cfg.MessageIDDomain) {
		return fmt.Errorf("message ID domain %q: not a valid domain", cfg.MessageIDDomain)
	}
	if cfg.Timeout <= 0 {
		return fmt.Errorf("timeout %s: want a positive duration", cfg.Timeout)
	}
	if cfg.PoolSize < 1 {
		return fmt.Errorf("pool size %d: want at least 1", cfg.PoolSize)
	}
	return nil
}

// withDefaults fills zero fields with their documented defaults.
func (cfg Config) withDefaults() Config {
	cfg.TLS = cmp.Or(cfg.TLS, TLSStartTLS)
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
		if cfg.TLS == TLSImplicit {
			cfg.Port = DefaultSMTPSPort
		}
	}
	if cfg.Username != "" {
		cfg.Auth = cmp.Or(strings.ToLower(cfg.Auth), "plain")
	}
	if cfg.MessageIDDomain == "" {
		if a, err := mail.ParseAddress(cfg.From); err == nil {
			if i := strings.LastIndexByte(a.Address, '@'); i >= 0 {
				cfg.MessageIDDomain = a.Address[i+1:]
			}
		}
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.PoolSize = cmp.Or(cfg.PoolSize, DefaultPoolSize)
	return cfg
}

func authType(a string) (gomail.SMTPAuthType, error) {
	switch a {
	case "plain":
		return gomail.SMTPAuthPlain, nil
	case "login":
		return gomail.SMTPAuthLogin, nil
	case "cram-md5":
		return gomail.SMTPAuthCramMD5, nil
	}
	return "", errors.New("want plain, login or cram-md5")
}

// Sender sends reminders through one SMTP relay. It is safe for concurrent
// use; at most Config.PoolSize connections are open at once.
type Sender struct {
	cfg  Config
	tmpl *Templates
	opts []gomail.Option
	tls  *tls.Config

	slots chan struct{} // one token per connection allowed to be in use

	mu     sync.Mutex
	idle   []*conn // most recently used last
	closed bool
}

var _ provider.Sender = (*Sender)(nil)

// New validates cfg and returns a Sender rendering from tmpl. It does not
// connect: the first Send dials, so a relay that is down at start delays
// reminders instead of stopping the process.
func New(cfg Config, tmpl *Templates) (*Sender, error) {
	if tmpl == nil {
		return nil, errors.New("creating email sender: templates are required")
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("creating email sender: %w", err)
	}
	s := &Sender{
		cfg:   cfg,
		tmpl:  tmpl,
		slots: make(chan struct{}, cfg.PoolSize),
		tls: &tls.Config{
			ServerName:         cfg.Host,
			MinVersion:         tls.VersionTLS12,
			InsecureSkipVerify: cfg.InsecureSkipVerify, //nolint:gosec // operator's explicit choice
		},
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("creating email sender: reading the CA file: %w", err)
		}
		s.tls.RootCAs = x509.NewCertPool()
		if !s.tls.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("creating email sender: %s holds no PEM certificate", cfg.CAFile)
		}
	}
	policy := gomail.NoTLS // TLSNone, and TLSImplicit where the dialer does TLS
	switch cfg.TLS {
	case TLSStartTLS:
		policy = gomail.TLSMandatory
	case TLSOpportunistic:
		policy = gomail.TLSOpportunistic
	}
	s.opts = []gomail.Option{
		gomail.WithPort(cfg.Port),
		gomail.WithTimeout(cfg.Timeout),
		gomail.WithTLSPolicy(policy),
		gomail.WithTLSConfig(s.tls),
		// The transaction is over once DATA is accepted; RSET would only add
		// a round trip per message.
		gomail.WithoutRset(),
	}
	if cfg.Username != "" {
		at, _ := authType(cfg.Auth) // checked by Validate
		s.opts = append(s.opts,
			gomail.WithSMTPAuth(at),
			gomail.WithUsername(cfg.Username),
			gomail.WithPassword(cfg.Password))
	}
	// Build one client now so that option errors surface here, not per send.
	if _, err := gomail.NewClient(cfg.Host, s.opts...); err != nil {
		return nil, fmt.Errorf("creating email sender: %w", err)
	}
	return s, nil
}

// Send renders msg.Template and delivers it to msg.Recipient. It returns the
// Message-ID without angle brackets ("key@domain", as Mailpit and most sinks
// report it). Errors are *provider.Error:
//
//   - Permanent "template": unknown template or a template that fails to execute.
//   - Permanent "address": the recipient is not a valid address.
//   - Permanent "message": the message has no idempotency key.
//   - Retryable provider.CodeNotStarted: msg.Gate refused the send once a
//     connection was ready; nothing was sent.
//   - Permanent "smtp_5xx": the relay rejected the recipient or the content.
//   - Retryable "smtp_4xx": the relay deferred the message.
//   - Retryable "timeout", "canceled", "network", "tls": the relay could not
//     be reached or the conversation broke; the outcome may be unknown.
//     ctx bounds every step (the wait for a pooled connection, the dial, TLS,
//     EHLO, AUTH, each command and the data): when it ends, the connection is
//     closed under go-mail, whose own deadlines come from Config.Timeout.
//   - Retryable "smtp_5xx" when the relay refuses the connection, AUTH or the
//     sender (MAIL FROM): those do not depend on the reminder, so failing it
//     permanently for a relay misconfiguration would be wrong.
//   - Retryable "closed": Send after Close.
func (s *Sender) Send(ctx context.Context, msg provider.Message) (string, error) {
	m, id, err := s.build(msg)
	if err != nil {
		return "", err
	}
	if err := s.deliver(ctx, m, msg.Open); err != nil {
		var gated *provider.Error
		if errors.As(err, &gated) && gated.Code == provider.CodeNotStarted {
			return "", gated
		}
		perr := classify(ctx, err)
		perr.Err = fmt.Errorf("sending reminder %d to %s: %w", msg.ReminderID, msg.Recipient, perr.Err)
		return "", perr
	}
	return id, nil
}

// build renders msg into a go-mail message and returns it with its Message-ID.
func (s *Sender) build(msg provider.Message) (*gomail.Msg, string, error) {
	if msg.IdempotencyKey == "" {
		return nil, "", provider.PermanentError("message",
			fmt.Errorf("sending reminder %d: empty idempotency key", msg.ReminderID))
	}
	data := make(map[string]any, len(msg.Data)+3)
	for k, v := range msg.Data {
		data[k] = v
	}
	// Facts about the reminder win over caller data with the same key.
	data["reminder_id"] = msg.ReminderID
	data["tenant"] = msg.Tenant
	data["deadline"] = msg.Deadline

	r, err := s.tmpl.Render(msg.Template, data)
	if err != nil {
		return nil, "", provider.PermanentError("template",
			fmt.Errorf("sending reminder %d: %w", msg.ReminderID, err))
	}

	m := gomail.NewMsg()
	if err := m.From(s.cfg.From); err != nil {
		return nil, "", provider.PermanentError("address",
			fmt.Errorf("sending reminder %d: from %q: %w", msg.ReminderID, s.cfg.From, err))
	}
	if strings.TrimSpace(msg.Recipient) == "" {
		return nil, "", provider.PermanentError("address",
			fmt.Errorf("sending reminder %d: empty recipient", msg.ReminderID))
	}
	if err := m.To(msg.Recipient); err != nil {
		return nil, "", provider.PermanentError("address",
			fmt.Errorf("sending reminder %d: recipient %q: %w", msg.ReminderID, msg.Recipient, err))
	}
	id := MessageID(msg.IdempotencyKey, s.cfg.MessageIDDomain)
	m.SetMessageIDWithValue(id)
	m.SetDate()
	m.Subject(r.Subject)
	m.SetUserAgent("Nudge")
	// RFC 3834: tells autoresponders not to answer a reminder.
	m.SetGenHeader("Auto-Submitted", "auto-generated")
	m.SetGenHeader(HeaderReminderID, strconv.FormatInt(msg.ReminderID, 10))
	m.SetGenHeader(HeaderIdempotencyKey, msg.IdempotencyKey)
	m.SetGenHeader(HeaderTenant, msg.Tenant)
	m.SetBodyString(gomail.TypeTextPlain, r.Text)
	if r.HTML != "" {
		m.AddAlternativeString(gomail.TypeTextHTML, r.HTML)
	}
	return m, id, nil
}

// MessageID returns the Message-ID (without angle brackets) that Send uses
// for an idempotency key: "key@domain". Characters a Message-ID cannot hold
// (anything outside RFC 5322 atext, a leading, trailing or doubled dot, and
// "=" itself) are written as "=XX" in hex, so distinct keys keep distinct IDs.
func MessageID(idempotencyKey, domain string) string {
	var b strings.Builder
	key := idempotencyKey
	for i := 0; i < len(key); i++ {
		c := key[i]
		ok := isAtext(c) && c != '='
		if c == '.' {
			ok = i > 0 && i < len(key)-1 && key[i-1] != '.'
		}
		if ok {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "=%02X", c)
		}
	}
	b.WriteByte('@')
	b.WriteString(domain)
	return b.String()
}

// isAtext reports whether c is RFC 5322 atext.
func isAtext(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-/=?^_`{|}~", c) >= 0
}

// isDotAtom reports whether s is a non-empty RFC 5322 dot-atom-text.
func isDotAtom(s string) bool {
	if s == "" {
		return false
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" {
			return false
		}
		for i := 0; i < len(part); i++ {
			if !isAtext(part[i]) {
				return false
			}
		}
	}
	return true
}

// conn is one pooled SMTP connection. Each has its own go-mail Client because
// the Client holds the dial function, which is how Send gets at the raw
// net.Conn to abort a conversation when its context ends.
type conn struct {
	mc       *gomail.Client
	sc       *smtp.Client
	raw      net.Conn
	lastUsed time.Time
}

// maxIdle is how long an idle connection is kept. Relays drop idle clients
// after a few minutes; discarding early avoids a failed NOOP and a redial.
const maxIdle = 30 * time.Second

// deliver sends m on a pooled connection, redialing when an idle connection
// turns out to be dead. open is the caller's last check (provider.Message.Open),
// run once a connection is in hand, immediately before m is sent on it: after
// the wait for a pool slot and the dial, which can take long.
func (s *Sender) deliver(ctx context.Context, m *gomail.Msg, open func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for an SMTP connection: %w", ctx.Err())
	}
	defer func() { <-s.slots }()

	for {
		c, reused, err := s.get(ctx)
		if err != nil {
			return err
		}
		if err := open(); err != nil {
			s.put(c) // unused, as healthy as it came
			return err
		}
		healthy, err := s.sendOn(ctx, c, m)
		if healthy {
			s.put(c)
		} else {
			c.abort()
		}
		if err == nil {
			return nil
		}
		// An idle connection the server has dropped fails the NOOP that
		// go-mail sends first, before anything of the message: safe to
		// resend on another connection. Each retry consumes an idle
		// connection or dials, so this ends.
		var se *gomail.SendError
		if reused && ctx.Err() == nil && errors.As(err, &se) && se.Reason == gomail.ErrConnCheck {
			continue
		}
		return err
	}
}

// sendOn sends m on c, closing the connection if ctx ends first. healthy
// says whether c can carry another message: only after a success, because
// after a failure the state of the SMTP conversation is not worth guessing.
func (s *Sender) sendOn(ctx context.Context, c *conn, m *gomail.Msg) (healthy bool, err error) {
	// go-mail checks the connection with NOOP before it refreshes the
	// deadline, and an idle connection's deadline has passed.
	if err := c.sc.UpdateDeadline(s.cfg.Timeout); err != nil {
		return false, &gomail.SendError{Reason: gomail.ErrConnCheck}
	}
	stop := context.AfterFunc(ctx, func() { _ = c.raw.Close() })
	err = c.mc.SendWithSMTPClient(c.sc, m)
	// If stop reports false, ctx ended and closed the connection, even if
	// the message got through first.
	return stop() && err == nil, err
}

// get returns an idle connection (reused=true) or dials a new one.
func (s *Sender) get(ctx context.Context) (c *conn, reused bool, err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, false, ErrClosed
	}
	now := time.Now()
	for len(s.idle) > 0 {
		c = s.idle[len(s.idle)-1]
		s.idle = s.idle[:len(s.idle)-1]
		if now.Sub(c.lastUsed) < maxIdle {
			s.mu.Unlock()
			return c, true, nil
		}
		go c.quit(s.cfg.Timeout) // expired: close without holding up the send
	}
	s.mu.Unlock()
	c, err = s.dial(ctx)
	return c, false, err
}

// put returns a healthy connection to the pool, or closes it if the Sender
// is closed.
func (s *Sender) put(c *conn) {
	c.lastUsed = time.Now()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.quit(s.cfg.Timeout)
		return
	}
	s.idle = append(s.idle, c)
	s.mu.Unlock()
}

// dialError marks an error from connection setup (TCP, greeting, EHLO,
// STARTTLS, AUTH), which does not depend on the message being sent.
type dialError struct{ err error }

func (e *dialError) Error() string { return "connecting to SMTP server: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// dial opens a connection, aborting it if ctx ends during setup.
func (s *Sender) dial(ctx context.Context) (*conn, error) {
	c := &conn{}
	var stopDial func() bool
	dialer := func(dctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		raw, err := d.DialContext(dctx, network, addr)
		if err != nil {
			return nil, err
		}
		c.raw = raw
		// dctx ends when go-mail's dial returns; ctx is the caller's.
		stopDial = context.AfterFunc(ctx, func() { _ = raw.Close() })
		if s.cfg.TLS != TLSImplicit {
			return raw, nil
		}
		tc := tls.Client(raw, s.tls)
		if err := tc.HandshakeContext(dctx); err != nil {
			_ = raw.Close()
			return nil, err
		}
		return tc, nil
	}
	opts := append(append([]gomail.Option(nil), s.opts...), gomail.WithDialContextFunc(dialer))
	mc, err := gomail.NewClient(s.cfg.Host, opts...)
	if err != nil {
		return nil, &dialError{err}
	}
	sc, err := mc.DialToSMTPClientWithContext(ctx)
	stopped := stopDial == nil || stopDial()
	if err != nil {
		if c.raw != nil {
			_ = c.raw.Close()
		}
		return nil, &dialError{err}
	}
	if !stopped {
		_ = c.raw.Close()
		return nil, &dialError{ctx.Err()}
	}
	c.mc, c.sc = mc, sc
	return c, nil
}

// abort closes a connection in an unknown state without QUIT.
func (c *conn) abort() {
	if c.raw != nil {
		_ = c.raw.Close()
	}
}

// quit ends a healthy connection politely, bounded by timeout.
func (c *conn) quit(timeout time.Duration) {
	if c.sc.UpdateDeadline(timeout) == nil {
		_ = c.mc.CloseWithSMTPClient(c.sc)
	}
	c.abort()
}

// Close closes idle connections and makes further Sends fail with ErrClosed.
// Sends in flight finish; their connections are closed when they do. Close is
// idempotent.
func (s *Sender) Close() error {
	s.mu.Lock()
	idle := s.idle
	s.idle = nil
	s.closed = true
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range idle {
		wg.Go(func() { c.quit(s.cfg.Timeout) })
	}
	wg.Wait()
	return nil
}

// classify turns a delivery error into a *provider.Error. See Send.
func classify(ctx context.Context, err error) *provider.Error {
	if errors.Is(err, ErrClosed) {
		return provider.RetryableError("closed", 0, err)
	}
	// The caller's context ending closes the connection, so whatever error
	// go-mail reports is a consequence of that.
	if ctxErr := ctx.Err(); ctxErr != nil {
		if !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w: %w", ctxErr, err)
		}
		if errors.Is(ctxErr, context.DeadlineExceeded) {
			return provider.RetryableError("timeout", 0, err)
		}
		return provider.RetryableError("canceled", 0, err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return provider.RetryableError("timeout", 0, err)
	}
	if errors.Is(err, context.Canceled) {
		return provider.RetryableError("canceled", 0, err)
	}

	var de *dialError
	if errors.As(err, &de) {
		if code := replyCode(err); code != 0 {
			return provider.RetryableError("smtp_"+strconv.Itoa(code), 0, err)
		}
		return networkError(err)
	}

	var se *gomail.SendError
	if errors.As(err, &se) {
		switch se.Reason {
		case gomail.ErrGetSender, gomail.ErrGetRcpts:
			return provider.PermanentError("address", err)
		}
		code := se.ErrorCode()
		switch {
		case se.IsTemp() || (code >= 400 && code < 500):
			return provider.RetryableError("smtp_"+strconv.Itoa(cmp.Or(code, 400)), 0, err)
		case code >= 500 && code < 600 && se.Reason == gomail.ErrSMTPMailFrom:
			// The sender is the same for every message: relay configuration.
			return provider.RetryableError("smtp_"+strconv.Itoa(code), 0, err)
		case code >= 500 && code < 600:
			return provider.PermanentError("smtp_"+strconv.Itoa(code), err)
		}
		// No reply code: the conversation broke. SendError does not unwrap,
		// so its cause is only visible in the text.
		if strings.Contains(se.Error(), "i/o timeout") {
			return provider.RetryableError("timeout", 0, err)
		}
		return provider.RetryableError("network", 0, err)
	}
	if code := replyCode(err); code >= 500 && code < 600 {
		return provider.PermanentError("smtp_"+strconv.Itoa(code), err)
	} else if code != 0 {
		return provider.RetryableError("smtp_"+strconv.Itoa(code), 0, err)
	}
	return networkError(err)
}

// networkError classifies a failure without an SMTP reply.
func networkError(err error) *provider.Error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return provider.RetryableError("timeout", 0, err)
	}
	var (
		certErr   *tls.CertificateVerificationError
		recordErr tls.RecordHeaderError
		alertErr  tls.AlertError
	)
	if errors.As(err, &certErr) || errors.As(err, &recordErr) || errors.As(err, &alertErr) ||
		strings.Contains(err.Error(), "STARTTLS") {
		return provider.RetryableError("tls", 0, err)
	}
	return provider.RetryableError("network", 0, err)
}

// replyCode returns the SMTP reply code carried by err, or 0.
func replyCode(err error) int {
	var te *textproto.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}
