package sms

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/provider"
)

// The provider APIs --sms-api chooses between.
const (
	APIGeneric = "generic"
	APITwilio  = "twilio"
)

// Flags are sms-worker's provider flags: which API to speak (--sms-api) and
// the settings of each.
type Flags struct {
	// API is APIGeneric or APITwilio.
	API     string
	Generic Config
	Twilio  TwilioConfig
	// TwilioTokenFile names a file holding the auth token (trailing
	// whitespace ignored), an alternative to --twilio-auth-token that keeps
	// the token out of the environment (a mounted Kubernetes secret).
	TwilioTokenFile string
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.API, "sms-api", APIGeneric, "SMS provider API: generic (POST URL/v1/messages with Idempotency-Key) or twilio")
	fs.StringVar(&f.Generic.URL, "sms-url", "http://127.0.0.1:9025", "generic API: base URL; messages are POSTed to URL/v1/messages")
	fs.StringVar(&f.Generic.Token, "sms-token", "", "generic API: bearer token")
	fs.StringVar(&f.Generic.Sender, "sms-sender", "", "generic API: sender id or number (empty: the provider's default)")
	fs.StringVar(&f.Twilio.URL, "twilio-url", DefaultTwilioURL, "twilio: API base URL (fake-sms serves the same routes)")
	fs.StringVar(&f.Twilio.AccountSID, "twilio-account-sid", "", "twilio: account SID (AC...)")
	fs.StringVar(&f.Twilio.AuthToken, "twilio-auth-token", "", "twilio: auth token (prefer --twilio-auth-token-file)")
	fs.StringVar(&f.TwilioTokenFile, "twilio-auth-token-file", "", "twilio: file holding the auth token")
	fs.StringVar(&f.Twilio.From, "twilio-from", "", "twilio: From number or alphanumeric sender ID")
	fs.StringVar(&f.Twilio.MessagingServiceSID, "twilio-messaging-service-sid", "",
		"twilio: messaging service SID (MG...), instead of --twilio-from")
	fs.StringVar(&f.Twilio.StatusCallback, "twilio-status-callback", "",
		"twilio: status callback URL for delivery reports (empty: none); nudge_ref=REF is added to its query")
}

// URL is the URL of the chosen API, for the transport checks.
func (f *Flags) URL() string {
	if f.API == APITwilio {
		return f.Twilio.URL
	}
	return f.Generic.URL
}

// Sender builds the adapter --sms-api chooses, with templates and the
// request timeout.
func (f *Flags) Sender(templates *Templates, timeout time.Duration) (provider.Looker, error) {
	switch f.API {
	case APIGeneric, "":
		cfg := f.Generic
		cfg.Templates, cfg.Timeout = templates, timeout
		return New(cfg)
	case APITwilio:
		cfg := f.Twilio
		cfg.Templates, cfg.Timeout = templates, timeout
		if f.TwilioTokenFile != "" {
			if cfg.AuthToken != "" {
				return nil, fmt.Errorf("%w: give --twilio-auth-token or --twilio-auth-token-file, not both", ErrInvalidConfig)
			}
			b, err := os.ReadFile(f.TwilioTokenFile)
			if err != nil {
				return nil, fmt.Errorf("--twilio-auth-token-file: %w", err)
			}
			cfg.AuthToken = strings.TrimSpace(string(b))
		}
		return NewTwilio(cfg)
	}
	return nil, fmt.Errorf("%w: --sms-api must be %s or %s, got %q", ErrInvalidConfig, APIGeneric, APITwilio, f.API)
}
