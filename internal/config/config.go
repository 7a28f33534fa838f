// Package config is what every Nudge binary shares at start-up: flags that
// fall back to NUDGE_* environment variables (so the same binary runs from a
// shell, docker compose and a Kubernetes manifest), the logger, the
// connections, and a context canceled by SIGINT or SIGTERM.
package config

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/redact"
)

// Version is set at build time with -ldflags "-X github.com/nudgehq/nudge/internal/config.Version=...".
var Version = "dev"

// EnvName is the environment variable that backs a flag: NUDGE_ and the
// flag's name in upper case with dashes as underscores.
func EnvName(flag string) string {
	return "NUDGE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// noEnv marks a flag that must be given on the command line.
const noEnv = "nudge_no_env"

// CommandLineOnly marks flags of fs that never fall back to the environment:
// an operator tool's selections and decisions (which reminders, --all,
// --dry-run) must be typed, never picked up from a stray variable.
func CommandLineOnly(fs *pflag.FlagSet, names ...string) {
	for _, n := range names {
		if f := fs.Lookup(n); f != nil {
			_ = fs.SetAnnotation(n, noEnv, []string{"true"})
		}
	}
}

func envBound(f *pflag.Flag) bool {
	_, off := f.Annotations[noEnv]
	return !off && f.Name != "help" && f.Name != "version"
}

// BindEnv makes every flag of cmd (and its subcommands) fall back to its
// environment variable, and names that variable in the flag's help, except
// flags marked CommandLineOnly. Once flags and environment are read, it
// checks the URLs and keys among them (CheckFlags) before the command runs.
// Call it once, after all flags are defined.
func BindEnv(cmd *cobra.Command) {
	annotate := func(f *pflag.Flag) {
		if !envBound(f) || strings.Contains(f.Usage, "$NUDGE_") {
			return
		}
		f.Usage += " [$" + EnvName(f.Name) + "]"
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(annotate)
		c.PersistentFlags().VisitAll(annotate)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(cmd)
	prev := cmd.PersistentPreRunE
	cmd.PersistentPreRunE = func(c *cobra.Command, args []string) error {
		var err error
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if err != nil || f.Changed || !envBound(f) {
				return
			}
			if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
				if e := f.Value.Set(v); e != nil {
					err = fmt.Errorf("environment variable %s=%q: %w", EnvName(f.Name), v, e)
				}
			}
		})
		if err != nil {
			return err
		}
		if err := CheckFlags(c.Flags()); err != nil {
			return err
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}

// Common is what most binaries need: where the database and broker are, the
// signing keys, the queue prefix and logging.
type Common struct {
	DatabaseURL string
	AMQPURL     string
	SigningKeys string
	QueuePrefix string
	// DeclareTopology makes the process declare the whole broker topology
	// at start instead of only checking that what it uses exists. Zero
	// value: check only (the migration step declares; internal/broker).
	DeclareTopology bool
	// PublishTimeout bounds one confirmed publish batch
	// (broker.Publisher.Timeout). Zero value: broker.DefaultPublishTimeout.
	PublishTimeout time.Duration
	LogLevel       string
	LogFormat      string
	// AllowInsecureTLS permits plain text or unverified TLS to hosts that
	// are not loopback (CheckFlags). Zero value: refused.
	AllowInsecureTLS bool
}

// Defaults for local development.
const (
	// No sslmode: pgx's default (prefer) is accepted on loopback only;
	// other hosts need sslmode=verify-full (CheckDatabaseURL).
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/nudge"
	DefaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
)

// RegisterDB adds the database and logging flags.
func (c *Common) RegisterDB(fs *pflag.FlagSet) {
	fs.StringVar(&c.DatabaseURL, "database-url", DefaultDatabaseURL,
		"PostgreSQL connection URL (search_path=SCHEMA selects a schema)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "auto", "log format: json, console, or auto (console on a terminal)")
	c.registerSecurity(fs)
}

// RegisterBroker adds the broker, signing and queue flags.
func (c *Common) RegisterBroker(fs *pflag.FlagSet) {
	fs.StringVar(&c.AMQPURL, "amqp-url", DefaultAMQPURL, "RabbitMQ connection URL")
	fs.StringVar(&c.SigningKeys, "signing-keys", "",
		"message signing keys, KID:SECRET[,KID:SECRET...]; the first signs, all verify (required). "+
			"A worker may hold only its channel's keys, KID@CHANNEL:HEX (nudgectl keys derive)")
	fs.StringVar(&c.QueuePrefix, "queue-prefix", broker.DefaultPrefix, "prefix of every exchange and queue name")
	fs.DurationVar(&c.PublishTimeout, "publish-timeout", broker.DefaultPublishTimeout,
		"bound on publishing a batch and waiting for its confirmations; past it the messages count as unconfirmed")
	fs.BoolVar(&c.DeclareTopology, "declare-topology", false,
		"declare the whole broker topology at start (needs configure permission on it; development only: "+
			"in production the migration step, nudgectl migrate --declare-topology, declares it and this process only checks it exists)")
}

// PrepareTopology is a broker binary's start-up step: it connects once as
// name and declares the topology (--declare-topology) or checks that what
// uses names exists, failing with the names of what is missing.
func (c *Common) PrepareTopology(name string, uses func(broker.Topology) broker.Uses) error {
	t := c.Topology()
	if err := t.PrepareAt(c.AMQPURL, name, c.DeclareTopology, uses(t)); err != nil {
		return fmt.Errorf("preparing the broker topology: %w", err)
	}
	return nil
}

// durationUnitOnce sets zerolog's process-wide duration unit once: Logger
// may be called from goroutines running side by side (parallel tests), and
// an unsynchronised write of the global is a data race.
var durationUnitOnce sync.Once

// Logger builds the process logger, tagged with the component name.
func (c *Common) Logger(component string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(c.LogLevel)
	if err != nil || c.LogLevel == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	var out io.Writer = os.Stdout
	switch c.LogFormat {
	case "json":
	case "console":
		out = zerolog.ConsoleWriter{Out: os.Stdout, TimeFormat: time.TimeOnly}
	case "auto", "":
		if isatty.IsTerminal(os.Stdout.Fd()) {
			out = zerolog.ConsoleWriter{Out: os.Stdout, TimeFormat: time.TimeOnly}
		}
	default:
		return zerolog.Nop(), fmt.Errorf("--log-format %q: want json, console or auto", c.LogFormat)
	}
	durationUnitOnce.Do(func() { zerolog.DurationFieldUnit = time.Millisecond })
	return zerolog.New(out).Level(lvl).With().Timestamp().Str("component", component).Logger(), nil
}

// Keys parses the signing keys.
func (c *Common) Keys() (*message.Keyring, error) {
	if c.SigningKeys == "" {
		return nil, fmt.Errorf("--signing-keys (or %s) is required: KID:SECRET[,KID:SECRET...]", EnvName("signing-keys"))
	}
	k, err := message.ParseKeys(c.SigningKeys)
	if err != nil {
		return nil, fmt.Errorf("--signing-keys: %w", err)
	}
	return k, nil
}

// Topology is the broker topology named by the queue prefix.
func (c *Common) Topology() broker.Topology {
	return broker.Topology{Prefix: c.QueuePrefix}.WithDefaults()
}

// Pool connects to PostgreSQL and checks the connection.
func (c *Common) Pool(ctx context.Context) (*pgxpool.Pool, error) {
	return c.PoolWith(ctx, DBTimeouts{})
}

// DBTimeouts bound every session of a process's pool, whatever role it logs
// in as (a superuser in development too): statement_timeout, lock_timeout
// and idle_in_transaction_session_timeout. Zero: that one is not set (the
// server's or the role's setting applies). A parameter given in
// --database-url wins.
type DBTimeouts struct {
	Statement, Lock, IdleInTransaction time.Duration
}

// PoolWith is Pool with the session timeouts t.
func (c *Common) PoolWith(ctx context.Context, t DBTimeouts) (*pgxpool.Pool, error) {
	var cfg *pgxpool.Config
	err := redact.Check(c.DatabaseURL, func(s string) (err error) {
		cfg, err = pgxpool.ParseConfig(s)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("--database-url: %w", err)
	}
	for name, d := range map[string]time.Duration{"statement_timeout": t.Statement, "lock_timeout": t.Lock,
		"idle_in_transaction_session_timeout": t.IdleInTransaction} {
		if _, set := cfg.ConnConfig.RuntimeParams[name]; !set && d > 0 {
			cfg.ConnConfig.RuntimeParams[name] = strconv.FormatInt(d.Milliseconds(), 10)
		}
	}
	// Nudge's statements are short and run thousands of times; PostgreSQL's
	// JIT compiles a plan whose estimated cost passes jit_above_cost on every
	// execution, and the dispatcher's claim passes it on a large table (40 of
	// 87 ms at 3M rows). A jit parameter in the URL still wins.
	if _, set := cfg.ConnConfig.RuntimeParams["jit"]; !set {
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to PostgreSQL at %s: %w", cfg.ConnConfig.Host, err)
	}
	return pool, nil
}

// SignalContext is canceled by SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// Actor names this process in the event trail: component@host-pid.
func Actor(component string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s@%s-%d", component, host, os.Getpid())
}

// Execute runs cmd and exits with its status: 0, 1 on error, or the code
// of an *ExitError.
func Execute(cmd *cobra.Command) {
	cmd.Version = Version
	cmd.SilenceUsage = true
	BindEnv(cmd)
	if err := cmd.Execute(); err != nil {
		if e, ok := err.(*ExitError); ok {
			os.Exit(e.Code)
		}
		os.Exit(1)
	}
}

// ExitError ends the process with Code after its message was printed.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }
