package email_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/nudgehq/nudge/internal/email"
)

// FuzzParseSMTPURL: any string either fails with an error that does not
// repeat the URL's password, or gives a configuration with a host, a port in
// range and a known TLS mode.
func FuzzParseSMTPURL(f *testing.F) {
	for _, s := range []string{
		"smtp://localhost:1025", "smtps://user:secret-pass@mail.example.com?from=Nudge%20%3Cr%40example.com%3E",
		"smtp://u:p@h:0", "smtp://h?tls=tls", "smtps://h?tls=none", "smtp://h?auth=plain", "smtp://h/path",
		"smtp://h?timeout=-1s&pool=0", "smtp:opaque", "smtp://[::1]:25?domain=example.com", "smtp://h?x=1&x=2",
		"smtp://us%zzer:pa ss@h", "smtp://:pass@h", "http://h",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		cfg, err := email.ParseSMTPURL(raw)
		if err != nil {
			if u, perr := url.Parse(raw); perr == nil && u.User != nil {
				if p, ok := u.User.Password(); ok && len(p) >= 6 && strings.Contains(err.Error(), p) {
					t.Fatalf("the error repeats the password %q: %v", p, err)
				}
			}
			return
		}
		if cfg.Host == "" || cfg.Port < 1 || cfg.Port > 65535 {
			t.Fatalf("accepted host %q port %d", cfg.Host, cfg.Port)
		}
		switch cfg.TLS {
		case email.TLSNone, email.TLSStartTLS, email.TLSOpportunistic, email.TLSImplicit:
		default:
			t.Fatalf("TLS mode %q", cfg.TLS)
		}
		if cfg.Auth != "" && cfg.Username == "" {
			t.Fatalf("auth %s without a user", cfg.Auth)
		}
	})
}
