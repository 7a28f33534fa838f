package config_test

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/internal/testenv"
)

// seen is what a test command's run saw.
type seen struct {
	Name     string
	Batch    int
	Every    time.Duration
	DryRun   bool
	Database string
	LogLevel string
	// PreName is --name as the command's own PersistentPreRunE saw it.
	PreName string
	Ran     bool
}

type envBundle struct {
	cmd  *cobra.Command
	seen *seen
}

// setupTree is a command tree like nudgectl's: persistent flags on the
// root, local flags on a subcommand, and a PersistentPreRunE of its own.
func setupTree(t *testing.T) *envBundle {
	t.Helper()
	var (
		s      seen
		common config.Common
	)
	root := &cobra.Command{Use: "nudge-test", SilenceUsage: true, SilenceErrors: true}
	common.RegisterDB(root.PersistentFlags())
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		s.PreName = s.Name
		return nil
	}
	sub := &cobra.Command{
		Use: "run",
		RunE: func(*cobra.Command, []string) error {
			s.Ran, s.Database, s.LogLevel = true, common.DatabaseURL, common.LogLevel
			return nil
		},
	}
	f := sub.Flags()
	f.StringVar(&s.Name, "name", "default-name", "a name")
	f.IntVar(&s.Batch, "batch", 500, "reminders per batch")
	f.DurationVar(&s.Every, "every", 0, "repeat every DURATION")
	f.BoolVar(&s.DryRun, "dry-run", false, "change nothing")
	root.AddCommand(sub)
	config.BindEnv(root)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	return &envBundle{cmd: root, seen: &s}
}

// setupSingle is a one-command binary like the dispatcher: every flag local.
func setupSingle(t *testing.T) *envBundle {
	t.Helper()
	var (
		s      seen
		common config.Common
	)
	cmd := &cobra.Command{
		Use: "single", SilenceUsage: true, SilenceErrors: true,
		RunE: func(*cobra.Command, []string) error {
			s.Ran, s.Database, s.LogLevel = true, common.DatabaseURL, common.LogLevel
			return nil
		},
	}
	f := cmd.Flags()
	common.RegisterDB(f)
	common.RegisterBroker(f)
	f.IntVar(&s.Batch, "batch", 500, "reminders per batch")
	config.BindEnv(cmd)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	return &envBundle{cmd: cmd, seen: &s}
}

func (b *envBundle) execute(args ...string) error {
	b.cmd.SetArgs(args)
	return b.cmd.Execute()
}

// unsetenv removes a variable for the test, restoring it afterwards.
func unsetenv(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		t.Setenv(n, "") // registers the restore
		require.NoError(t, os.Unsetenv(n))
	}
}

func TestEnvName(t *testing.T) {
	t.Parallel()
	for flag, want := range map[string]string{
		"database-url": "NUDGE_DATABASE_URL",
		"batch":        "NUDGE_BATCH",
		"log-level":    "NUDGE_LOG_LEVEL",
		"signing-keys": "NUDGE_SIGNING_KEYS",
		"due-at":       "NUDGE_DUE_AT",
	} {
		require.Equal(t, want, config.EnvName(flag), "flag %s", flag)
	}
}

// Tests that call t.Setenv cannot run in parallel.

func TestBindEnvDefaultsWithoutEnvironment(t *testing.T) {
	unsetenv(t, "NUDGE_NAME", "NUDGE_BATCH", "NUDGE_EVERY", "NUDGE_DRY_RUN", "NUDGE_DATABASE_URL", "NUDGE_LOG_LEVEL")
	b := setupTree(t)
	require.NoError(t, b.execute("run"))
	require.Equal(t, seen{
		Name: "default-name", Batch: 500, Database: config.DefaultDatabaseURL, LogLevel: "info",
		PreName: "default-name", Ran: true,
	}, *b.seen)
}

func TestBindEnvTakesUnsetFlagsFromEnvironment(t *testing.T) {
	t.Setenv("NUDGE_NAME", "from-env")
	t.Setenv("NUDGE_BATCH", "42")
	t.Setenv("NUDGE_EVERY", "90s")
	t.Setenv("NUDGE_DRY_RUN", "true")
	t.Setenv("NUDGE_DATABASE_URL", "postgres://env-host/nudge?sslmode=verify-full") // a persistent flag of the root
	t.Setenv("NUDGE_LOG_LEVEL", "debug")

	b := setupTree(t)
	require.NoError(t, b.execute("run"))
	require.Equal(t, seen{
		Name: "from-env", Batch: 42, Every: 90 * time.Second, DryRun: true,
		Database: "postgres://env-host/nudge?sslmode=verify-full", LogLevel: "debug",
		PreName: "from-env", // the command's own pre-run hook runs after the environment is applied
		Ran:     true,
	}, *b.seen)

	single := setupSingle(t)
	require.NoError(t, single.execute())
	require.Equal(t, 42, single.seen.Batch)
	require.Equal(t, "postgres://env-host/nudge?sslmode=verify-full", single.seen.Database)
}

func TestBindEnvFlagBeatsEnvironment(t *testing.T) {
	t.Setenv("NUDGE_NAME", "from-env")
	t.Setenv("NUDGE_BATCH", "42")
	t.Setenv("NUDGE_DATABASE_URL", "postgres://env-host/nudge?sslmode=verify-full")

	b := setupTree(t)
	require.NoError(t, b.execute("run", "--name", "from-flag", "--database-url", "postgres://flag-host/nudge?sslmode=verify-full"))
	require.Equal(t, "from-flag", b.seen.Name)
	require.Equal(t, "postgres://flag-host/nudge?sslmode=verify-full", b.seen.Database)
	require.Equal(t, 42, b.seen.Batch, "flags not given still come from the environment")

	// A flag given with its default value still counts as given.
	b = setupTree(t)
	require.NoError(t, b.execute("run", "--batch=500"))
	require.Equal(t, 500, b.seen.Batch)
}

func TestBindEnvInvalidValueNamesVariable(t *testing.T) {
	cases := []struct {
		env, value string
	}{
		{"NUDGE_BATCH", "abc"},
		{"NUDGE_EVERY", "5 minutes"},
		{"NUDGE_DRY_RUN", "maybe"},
	}
	for _, tc := range cases {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(tc.env, tc.value)
			b := setupTree(t)
			err := b.execute("run")
			require.Error(t, err)
			require.Contains(t, err.Error(), "environment variable "+tc.env+`="`+tc.value+`"`)
			require.False(t, b.seen.Ran, "the command must not run with a bad environment")
		})
	}

	// A bad variable for a flag given on the command line is not read at all.
	t.Setenv("NUDGE_BATCH", "abc")
	b := setupTree(t)
	require.NoError(t, b.execute("run", "--batch", "7"))
	require.Equal(t, 7, b.seen.Batch)
}

// The real nudgectl tree takes its persistent --database-url from the environment.
func TestBindEnvNudgectlDatabaseURL(t *testing.T) {
	db := testenv.Postgres(t)
	t.Setenv("NUDGE_DATABASE_URL", db.URL)

	cmd := ctl.Command()
	cmd.SilenceUsage = true
	config.BindEnv(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"migrate"})
	require.NoError(t, cmd.Execute())
	// The schema of NUDGE_DATABASE_URL, migrated already (as far as testenv
	// goes: an after-rollout step may wait).
	require.Regexp(t, `^(schema is up to date|no migration to apply before the rollout completes)\n`, out.String())

	t.Setenv("NUDGE_DATABASE_URL", "postgres://%zz")
	cmd = ctl.Command()
	config.BindEnv(cmd)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"stats"})
	require.ErrorContains(t, cmd.Execute(), "--database-url")
}

// allFlags visits every flag of cmd and its subcommands.
func allFlags(cmd *cobra.Command, fn func(c *cobra.Command, f *pflag.Flag)) {
	cmd.Flags().VisitAll(func(f *pflag.Flag) { fn(cmd, f) })
	cmd.PersistentFlags().VisitAll(func(f *pflag.Flag) { fn(cmd, f) })
	for _, sub := range cmd.Commands() {
		allFlags(sub, fn)
	}
}

func TestBindEnvHelpNamesVariable(t *testing.T) {
	t.Parallel()

	trees := map[string]*cobra.Command{
		"tree":     setupTree(t).cmd,
		"single":   setupSingle(t).cmd,
		"nudgectl": ctl.Command(),
	}
	config.BindEnv(trees["nudgectl"])
	config.BindEnv(trees["nudgectl"]) // twice: still one annotation per flag
	for name, tree := range trees {
		n := 0
		allFlags(tree, func(c *cobra.Command, f *pflag.Flag) {
			if _, cmdLineOnly := f.Annotations["nudge_no_env"]; cmdLineOnly {
				require.NotContains(t, f.Usage, "$NUDGE_", "%s --%s is command-line only", name, f.Name)
				return
			}
			n++
			want := "[$" + config.EnvName(f.Name) + "]"
			require.True(t, strings.HasSuffix(f.Usage, " "+want), "%s %s --%s: usage %q", name, c.Name(), f.Name, f.Usage)
			require.Equal(t, 1, strings.Count(f.Usage, "$NUDGE_"), "%s --%s: usage %q", name, f.Name, f.Usage)
		})
		require.Positive(t, n, name)
	}

	// The help output shows them, for inherited flags too.
	cmd := ctl.Command()
	config.BindEnv(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"schedule", "--help"})
	require.NoError(t, cmd.Execute())
	for _, want := range []string{"[$NUDGE_DATABASE_URL]", "[$NUDGE_LOG_LEVEL]"} {
		require.Contains(t, out.String(), want)
	}
	for _, unwanted := range []string{"NUDGE_DUE_AT", "NUDGE_FILE", "NUDGE_TENANT"} {
		require.NotContains(t, out.String(), unwanted, "what to schedule is typed, never taken from the environment")
	}
	require.NotContains(t, out.String(), "NUDGE_HELP")
}

func TestKeys(t *testing.T) {
	t.Parallel()

	_, err := (&config.Common{}).Keys()
	require.Error(t, err)
	require.Contains(t, err.Error(), "--signing-keys")
	require.Contains(t, err.Error(), "NUDGE_SIGNING_KEYS")
	require.Contains(t, err.Error(), "is required")

	for _, bad := range []string{"no-colon", "k1:short", ":0123456789abcdef", " , "} {
		_, err := (&config.Common{SigningKeys: bad}).Keys()
		require.Error(t, err, bad)
		require.True(t, strings.HasPrefix(err.Error(), "--signing-keys: "), "%q: %v", bad, err)
	}

	k, err := (&config.Common{SigningKeys: "k2:0123456789abcdef0123,k1:fedcba9876543210fedc"}).Keys()
	require.NoError(t, err)
	require.Equal(t, "k2", k.ActiveKeyID(), "the first key signs")
}

func TestLogger(t *testing.T) {
	t.Parallel()

	cases := []struct {
		name          string
		level, format string
		want          string // error substring; "" for success
		wantLevel     zerolog.Level
	}{
		{"defaults", "info", "auto", "", zerolog.InfoLevel},
		{"debug json", "debug", "json", "", zerolog.DebugLevel},
		{"warn console", "warn", "console", "", zerolog.WarnLevel},
		{"error, empty format is auto", "error", "", "", zerolog.ErrorLevel},
		{"bad level", "loud", "json", `--log-level "loud"`, 0},
		{"empty level", "", "json", `--log-level ""`, 0},
		{"bad format", "info", "xml", `--log-format "xml"`, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log, err := (&config.Common{LogLevel: tc.level, LogFormat: tc.format}).Logger("test")
			if tc.want != "" {
				require.ErrorContains(t, err, tc.want)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantLevel, log.GetLevel())
		})
	}
}

func TestExitError(t *testing.T) {
	t.Parallel()
	inner := os.ErrNotExist
	err := error(&config.ExitError{Code: 2, Err: inner})
	require.Equal(t, inner.Error(), err.Error())
	require.ErrorIs(t, err, os.ErrNotExist)
}
