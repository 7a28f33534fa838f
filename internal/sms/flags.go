package sms

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/clock"
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
	API string
	// Providers lists APIs in order of preference for failover
	// (--sms-providers twilio,generic); empty: API alone, no failover.
	Providers []string
	// Failover is when the fleet moves between Providers.
	Failover FailoverConfig
	Generic  Config
	Twilio   TwilioConfig
	// TwilioTokenFile names a file holding the auth token (trailing
	// whitespace ignored), an alternative to --twilio-auth-token that keeps
	// the token out of the environment (a mounted Kubernetes secret).
	TwilioTokenFile string
	// CallbackListen is where sms-worker receives Twilio's status
	// callbacks (--twilio-callback-listen); empty: nowhere.
	CallbackListen string
}

// Register adds the flags to fs.
func (f *Flags) Register(fs *pflag.FlagSet) {
	fs.StringVar(&f.API, "sms-api", APIGeneric, "SMS provider API: generic (POST URL/v1/messages with Idempotency-Key) or twilio")
	fs.StringSliceVar(&f.Providers, "sms-providers", nil,
		"SMS providers in order of preference, for failover shared by the fleet (e.g. twilio,generic; each configured by its own flags); empty: --sms-api alone")
	fs.IntVar(&f.Failover.After, "sms-failover-after", DefaultFailoverAfter,
		"failover: consecutive retryable failures (5xx, 429, timeouts) at the current provider that move the fleet to the next")
	fs.Float64Var(&f.Failover.ErrorRate, "sms-failover-error-rate", 0,
		"failover: share of retryable failures in the window that moves the fleet (0: no rate rule)")
	fs.DurationVar(&f.Failover.Window, "sms-failover-window", DefaultFailoverWindow, "failover: the error-rate window")
	fs.IntVar(&f.Failover.MinSends, "sms-failover-min-sends", DefaultFailoverMin,
		"failover: sends the window needs before the error rate applies")
	fs.DurationVar(&f.Failover.ProbeEvery, "sms-failover-probe", DefaultFailoverProbe,
		"failover: away from the first provider, how often one worker of the fleet sends through it as a probe")
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
	fs.StringVar(&f.CallbackListen, "twilio-callback-listen", "",
		"twilio: address to receive the status callbacks on (e.g. :8081; empty: none), verified with the auth token against --twilio-status-callback")
}

// authToken is the Twilio auth token, from --twilio-auth-token or the file
// --twilio-auth-token-file names.
func (f *Flags) authToken() (string, error) {
	if f.TwilioTokenFile == "" {
		return f.Twilio.AuthToken, nil
	}
	if f.Twilio.AuthToken != "" {
		return "", fmt.Errorf("%w: give --twilio-auth-token or --twilio-auth-token-file, not both", ErrInvalidConfig)
	}
	b, err := os.ReadFile(f.TwilioTokenFile)
	if err != nil {
		return "", fmt.Errorf("--twilio-auth-token-file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Callbacks builds the status-callback receiver --twilio-callback-listen
// serves, recording into rec.
func (f *Flags) Callbacks(rec StatusRecorder, clk clock.Clock, log zerolog.Logger) (*Callbacks, error) {
	if f.Twilio.StatusCallback == "" {
		return nil, fmt.Errorf("%w: --twilio-callback-listen needs --twilio-status-callback, the URL Twilio calls", ErrInvalidConfig)
	}
	token, err := f.authToken()
	if err != nil {
		return nil, err
	}
	return NewCallbacks(token, f.Twilio.StatusCallback, rec, clk, log)
}

// APIs returns the APIs in use: Providers, or API alone.
func (f *Flags) APIs() []string {
	if len(f.Providers) > 0 {
		return f.Providers
	}
	return []string{f.API}
}

// URL is the URL of an API, for the transport checks.
func (f *Flags) URL(api string) string {
	if api == APITwilio {
		return f.Twilio.URL
	}
	return f.Generic.URL
}

// Sender builds the adapter --sms-api chooses, or a Failover over the
// adapters --sms-providers lists, with templates and the request timeout.
// A Failover must be given the fleet's shared state (Share) before it sends.
func (f *Flags) Sender(templates *Templates, timeout time.Duration) (provider.Looker, error) {
	if len(f.Providers) == 0 {
		return f.adapter(f.API, templates, timeout)
	}
	named := make([]Named, len(f.Providers))
	for i, api := range f.Providers {
		l, err := f.adapter(api, templates, timeout)
		if err != nil {
			return nil, fmt.Errorf("--sms-providers: %w", err)
		}
		named[i] = Named{Name: api, Looker: l}
	}
	return NewFailover(f.Failover, named)
}

// adapter builds the adapter of one API.
func (f *Flags) adapter(api string, templates *Templates, timeout time.Duration) (provider.Looker, error) {
	switch api {
	case APIGeneric, "":
		cfg := f.Generic
		cfg.Templates, cfg.Timeout = templates, timeout
		return New(cfg)
	case APITwilio:
		cfg := f.Twilio
		cfg.Templates, cfg.Timeout = templates, timeout
		token, err := f.authToken()
		if err != nil {
			return nil, err
		}
		cfg.AuthToken = token
		return NewTwilio(cfg)
	}
	return nil, fmt.Errorf("%w: an SMS API must be %s or %s, got %q", ErrInvalidConfig, APIGeneric, APITwilio, api)
}
