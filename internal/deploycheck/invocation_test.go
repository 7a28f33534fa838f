package deploycheck

import (
	"strings"
	"testing"
)

// mailer is a clis holding the made-up binary of mailerHelp.
func mailer() clis {
	c, _ := parseHelp("mailer", mailerHelp)
	return clis{"mailer": c}
}

const validKeys = "dev:change-me-0123456789abcdef"

func TestCheckInvocation(t *testing.T) {
	t.Parallel()
	keys := map[string]envValue{"NUDGE_SIGNING_KEYS": {val: validKeys, known: true}}
	with := func(kv ...string) map[string]envValue {
		env := map[string]envValue{"NUDGE_SIGNING_KEYS": keys["NUDGE_SIGNING_KEYS"]}
		for i := 0; i < len(kv); i += 2 {
			env[kv[i]] = envValue{val: kv[i+1], known: true}
		}
		return env
	}
	for _, c := range []struct {
		name string
		argv []string
		env  map[string]envValue
		want string // a substring of one error; "" for none
	}{
		{name: "valid", argv: []string{"mailer", "--grace=10s", "-n", "8", "--declare-topology"}, env: keys},
		{name: "path to the binary", argv: []string{"/usr/local/bin/mailer"}, env: keys},
		{name: "no command", env: keys, want: "no command: the image has no entrypoint"},
		{name: "unknown binary", argv: []string{"mailr"}, env: keys, want: `"mailr" is not a binary built from ./cmd/... (have mailer)`},
		{name: "unknown long flag", argv: []string{"mailer", "--evry=5s"}, env: keys, want: "mailer has no flag --evry"},
		{name: "unknown short flag", argv: []string{"mailer", "-x"}, env: keys, want: "mailer has no flag -x"},
		{name: "long flag without its value", argv: []string{"mailer", "--grace"}, env: keys, want: "--grace needs a value"},
		{name: "short flag without its value", argv: []string{"mailer", "-n"}, env: keys, want: "-n needs a value"},
		{name: "argument", argv: []string{"mailer", "now"}, env: keys, want: `mailer takes no arguments, got "now"`},
		{name: "argument after --", argv: []string{"mailer", "--", "now"}, env: keys, want: "mailer takes no arguments"},
		{name: "bad flag value", argv: []string{"mailer", "--grace", "5 seconds"}, env: keys, want: `--grace (from --grace) = "5 seconds"`},
		{name: "bad short flag value", argv: []string{"mailer", "-n=many"}, env: keys, want: `--concurrency (from -n) = "many"`},
		{name: "bad variable value", argv: []string{"mailer"}, env: with("NUDGE_GRACE", "5 seconds"), want: `--grace (from NUDGE_GRACE) = "5 seconds"`},
		{name: "misspelt variable", argv: []string{"mailer"}, env: with("NUDGE_GRAC", "5s"), want: "NUDGE_GRAC is not the variable of any flag of mailer (did you mean NUDGE_GRACE?)"},
		{name: "required flag missing", argv: []string{"mailer"}, want: "--signing-keys is required: set it or NUDGE_SIGNING_KEYS"},
		{name: "required flag empty", argv: []string{"mailer", "--signing-keys="}, want: "--signing-keys is required"},
		{name: "required flag from outside", argv: []string{"mailer"}, env: map[string]envValue{"NUDGE_SIGNING_KEYS": {}}},
		{name: "bad URL", argv: []string{"mailer", "--amqp-url=http://rabbitmq/"}, env: keys, want: `scheme "http": want amqp or amqps`},
		{name: "bad signing key", argv: []string{"mailer"}, env: with("NUDGE_SIGNING_KEYS", "dev:short"), want: "--signing-keys (from NUDGE_SIGNING_KEYS)"},
		{name: "not a NUDGE_ variable", argv: []string{"mailer"}, env: with("GOMAXPROCS", "2")},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, errs := mailer().check(invocation{where: "here", argv: c.argv, env: c.env})
			if c.want == "" {
				for _, err := range errs {
					t.Error(err)
				}
				return
			}
			for _, err := range errs {
				if strings.Contains(err.Error(), c.want) && strings.HasPrefix(err.Error(), "here: ") {
					return
				}
			}
			t.Errorf("no error mentions %q; got %v", c.want, errs)
		})
	}
}

func TestCheckInvocationPrecedence(t *testing.T) {
	t.Parallel()
	r, errs := mailer().check(invocation{
		where: "here",
		argv:  []string{"mailer", "--grace=10s"},
		env: map[string]envValue{
			"NUDGE_SIGNING_KEYS": {val: validKeys, known: true},
			"NUDGE_GRACE":        {val: "20s", known: true},
			"NUDGE_EVERY":        {val: "1m", known: true},
		},
		shared: map[string]envValue{
			"NUDGE_EVERY":       {val: "2m", known: true},
			"NUDGE_CONCURRENCY": {val: "6", known: true},
			"NUDGE_OTHERS_FLAG": {val: "x", known: true}, // another binary's: ignored
		},
	})
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for flag, want := range map[string][2]string{
		"grace":       {"10s", "--grace"},         // the command line beats the environment
		"every":       {"1m", "NUDGE_EVERY"},      // env beats envFrom
		"concurrency": {"6", "NUDGE_CONCURRENCY"}, // envFrom beats the default
		"amqp-url":    {"amqp://guest:guest@127.0.0.1:5672/", "default"},
	} {
		if got := [2]string{r.values[flag], r.source[flag]}; got != want {
			t.Errorf("--%s = %q from %s, want %q from %s", flag, got[0], got[1], want[0], want[1])
		}
	}
	if d, ok := r.duration("grace"); !ok || d.String() != "10s" {
		t.Errorf("duration(grace) = %v, %v", d, ok)
	}
	if _, ok := r.duration("amqp-url"); ok {
		t.Error("duration of a URL")
	}
}

func TestEditDistance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"", "abc", 3}, {"abc", "abc", 0}, {"kitten", "sitting", 3},
		{"NUDGE_SMTP_URI", "NUDGE_SMTP_URL", 1}, {"NUDGE_GRAC", "NUDGE_GRACE", 1},
	} {
		if got := editDistance(c.a, c.b); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
