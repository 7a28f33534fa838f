// Command fake-sms serves the fake SMS provider (internal/fakesms) on a TCP
// address, so a developer or an end-to-end run can point sms-worker at a
// provider whose faults they control (PUT /control) and whose records they
// can read (GET /messages, /attempts, /stats).
//
// Every flag falls back to an environment variable NUDGE_FAKE_SMS_<FLAG>
// (upper case, dashes as underscores), so the same binary is configured the
// same way from a shell, docker compose or Kubernetes.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // the zone database, for images without one (pkg/localtime)

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/fakesms"
)

const (
	envPrefix       = "NUDGE_FAKE_SMS_"
	shutdownTimeout = 10 * time.Second
)

func main() {
	if err := newCommand().Execute(); err != nil {
		os.Exit(1) // cobra has printed the error
	}
}

// options are the flag values.
type options struct {
	listen      string
	token       string
	twilioSID   string
	twilioToken string
	rate429     float64
	rate5xx     float64
	rate4xx     float64
	rateTimeout float64
	delay       time.Duration
	stall       time.Duration
	retryAfter  int
	seed        uint64
}

func newCommand() *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:   "fake-sms",
		Short: "Serve a fake SMS provider with injectable faults",
		Long: `fake-sms serves an SMS provider API (POST /v1/messages) that deduplicates on
Idempotency-Key, and Twilio's Message resource (create, fetch, list, status
callbacks under /2010-04-01/Accounts/SID/), which does not. Both inject the
same faults: 429 with Retry-After, 5xx, 4xx, fixed delays and timeouts after
accepting. Faults can be changed while it runs:

  curl -X PUT localhost:9025/control -d '{"rate_5xx":0.2,"script":["429","timeout_after_accept"]}'

Other routes: GET /control, POST /reset, GET /messages, GET /attempts,
GET /stats, GET /healthz.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags()); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			go func() {
				<-ctx.Done()
				stop() // a second signal kills the process
			}()
			return run(ctx, o, newLogger(os.Stdout))
		},
	}

	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "127.0.0.1:9025", "`address` to serve on")
	f.StringVar(&o.token, "token", "", "bearer `token` POST /v1/messages requires; empty accepts any")
	f.StringVar(&o.twilioSID, "twilio-account-sid", "", "Twilio account `SID` the Twilio routes serve, with basic auth; empty serves any without auth")
	f.StringVar(&o.twilioToken, "twilio-auth-token", "", "Twilio auth `token` the Twilio routes require with --twilio-account-sid")
	f.Float64Var(&o.rate5xx, "rate-5xx", 0, "probability of answering 503")
	f.Float64Var(&o.rate429, "rate-429", 0, "probability of answering 429")
	f.Float64Var(&o.rate4xx, "rate-4xx", 0, "probability of answering 400")
	f.Float64Var(&o.rateTimeout, "rate-timeout", 0, "probability of accepting and then stalling (timeout after accept)")
	f.DurationVar(&o.delay, "delay", 0, "fixed delay before answering each send")
	f.DurationVar(&o.stall, "stall", 0, "how long a timeout stalls before answering; 0 hangs until the client leaves")
	f.IntVar(&o.retryAfter, "retry-after", 1, "Retry-After `seconds` sent with 429s; 0 sends none")
	f.Uint64Var(&o.seed, "seed", 0, "seed of the fault generator: the same seed and requests give the same faults")
	documentEnv(f)
	return cmd
}

// run serves until ctx is canceled, then shuts down gracefully.
func run(ctx context.Context, o options, log zerolog.Logger) error {
	cfg := fakesms.Config{
		Rate429:                o.rate429,
		Rate5xx:                o.rate5xx,
		Rate4xx:                o.rate4xx,
		RateTimeoutAfterAccept: o.rateTimeout,
		Delay:                  o.delay,
		Stall:                  o.stall,
		RetryAfterSeconds:      o.retryAfter,
		Seed:                   o.seed,
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("checking fault flags: %w", err)
	}
	fake := fakesms.New(
		fakesms.WithConfig(cfg),
		fakesms.WithToken(o.token),
		fakesms.WithTwilioAccount(o.twilioSID, o.twilioToken),
		fakesms.WithAttemptHook(func(a fakesms.Attempt) { logAttempt(log, a) }),
	)

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.listen, err)
	}
	srv := &http.Server{Handler: fake, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info().Str("addr", ln.Addr().String()).Interface("config", cfg).Msg("fake sms provider listening")

	select {
	case err := <-served:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	log.Info().Msg("shutting down")
	fake.Close() // release stalled handlers so Shutdown does not wait on them
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving: %w", err)
	}
	log.Info().Msg("stopped")
	return nil
}

func logAttempt(log zerolog.Logger, a fakesms.Attempt) {
	ev := log.Info()
	if a.Status >= 400 {
		ev = log.Warn()
	}
	ev.Int("seq", a.Seq).
		Str("api", a.API).
		Str("idempotency_key", a.IdempotencyKey).
		Str("to", a.To).
		Str("tenant", a.Tenant).
		Int("status", a.Status).
		Bool("duplicate", a.Duplicate).
		Str("fault", a.Fault).
		Bool("scripted", a.Scripted).
		Bool("client_gone", a.ClientGone).
		Str("message_id", a.MessageID).
		Str("error", a.Error).
		Msg("send attempt")
}

// newLogger logs JSON, or human-readable lines when w is a terminal.
func newLogger(w *os.File) zerolog.Logger {
	var out io.Writer = w
	if fi, err := w.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(out).With().Timestamp().Str("service", "fake-sms").Logger()
}

// envName is the environment variable a flag falls back to.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// documentEnv adds each flag's environment variable to its help, and its
// default where pflag would hide a zero one.
func documentEnv(fs *pflag.FlagSet) {
	fs.VisitAll(func(f *pflag.Flag) {
		f.Usage += fmt.Sprintf(" [env %s]", envName(f.Name))
		switch f.DefValue {
		case "0", "0s":
			f.Usage += fmt.Sprintf(" (default %s)", f.DefValue)
		case "":
			f.Usage += ` (default "")`
		}
	})
}

// applyEnv sets every flag not given on the command line from its
// environment variable, if that is set and not empty.
func applyEnv(fs *pflag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok || v == "" {
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
		}
	})
	return errors.Join(errs...)
}
