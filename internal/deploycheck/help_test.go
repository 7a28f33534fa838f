package deploycheck

import (
	"slices"
	"testing"
)

func TestBinariesHelpIsUnderstood(t *testing.T) {
	cs := binaries(t)
	for _, want := range []string{"dispatcher", "email-worker", "sms-worker", "webhook-worker", "reconciler", "nudgectl", "fake-sms"} {
		if cs[want] == nil {
			t.Errorf("go build ./cmd/... did not build %s (built %v)", want, cs.names())
		}
	}
	// A few flags the checks rely on, to prove the help parser reads them.
	for _, c := range []struct{ bin, flag, env, def string }{
		{"dispatcher", "budget", "NUDGE_BUDGET", "4m0s"},
		{"dispatcher", "every", "NUDGE_EVERY", ""},
		{"email-worker", "grace", "NUDGE_GRACE", "25s"},
		{"sms-worker", "listen", "NUDGE_LISTEN", "127.0.0.1:8080"},
		{"fake-sms", "listen", "NUDGE_FAKE_SMS_LISTEN", "127.0.0.1:9025"},
	} {
		f := cs[c.bin].flags[c.flag]
		if f == nil || f.env != c.env || f.def != c.def {
			t.Errorf("%s --%s: parsed %+v, want env %s default %q", c.bin, c.flag, f, c.env, c.def)
		}
	}
	if f := cs["dispatcher"].flags["signing-keys"]; f == nil || !f.required {
		t.Errorf("dispatcher --signing-keys should parse as required: %+v", f)
	}
	if m := cs["nudgectl"].subs["migrate"]; m == nil || m.flags["database-url"] == nil {
		t.Errorf("nudgectl migrate should inherit --database-url")
	}
}

// mailerHelp is cobra's --help for a made-up binary, in the shape the real
// ones print (see `nudgectl migrate --help`).
const mailerHelp = `Sends email.

Usage:
  mailer [flags]

Flags:
      --amqp-url string       RabbitMQ connection URL [$NUDGE_AMQP_URL] (default "amqp://guest:guest@127.0.0.1:5672/")
  -n, --concurrency int       sends at once [$NUDGE_CONCURRENCY] (default 4)
      --declare-topology      also declare the broker topology
      --every duration        loop every DURATION [$NUDGE_EVERY]
      --grace duration        drain for at most this long [$NUDGE_GRACE] (default 25s)
  -h, --help                  help for mailer
      --send-timeout duration one provider call at most [$NUDGE_SEND_TIMEOUT] (default 20s)
      --signing-keys string   ID:SECRET,... (required) [$NUDGE_SIGNING_KEYS]

Use "mailer --help" for more.
`

func TestParseHelp(t *testing.T) {
	t.Parallel()
	c, subs := parseHelp("mailer", mailerHelp)
	if len(subs) != 0 || c.allowArgs || c.path != "mailer" {
		t.Errorf("subs %v, allowArgs %v, path %q", subs, c.allowArgs, c.path)
	}
	for _, want := range []flagInfo{
		{name: "amqp-url", typ: "string", env: "NUDGE_AMQP_URL", def: "amqp://guest:guest@127.0.0.1:5672/", hasDef: true, usage: "RabbitMQ connection URL"},
		{name: "concurrency", short: "n", typ: "int", env: "NUDGE_CONCURRENCY", def: "4", hasDef: true, usage: "sends at once"},
		{name: "declare-topology", usage: "also declare the broker topology"},
		{name: "every", typ: "duration", env: "NUDGE_EVERY", usage: "loop every DURATION"},
		{name: "grace", typ: "duration", env: "NUDGE_GRACE", def: "25s", hasDef: true, usage: "drain for at most this long"},
		{name: "help", short: "h", usage: "help for mailer"},
		{name: "signing-keys", typ: "string", env: "NUDGE_SIGNING_KEYS", usage: "ID:SECRET,... (required)", required: true},
	} {
		if got := c.flags[want.name]; got == nil || *got != want {
			t.Errorf("--%s: parsed %+v, want %+v", want.name, got, want)
		}
	}
	// A placeholder without two spaces after it is not a flag line cobra
	// prints; it is skipped rather than misread.
	if f := c.flags["send-timeout"]; f != nil {
		t.Errorf("--send-timeout parsed from a malformed line: %+v", f)
	}
	if c.short["n"] != c.flags["concurrency"] || c.env["NUDGE_GRACE"] != c.flags["grace"] {
		t.Error("the short and env indexes do not point at the flags")
	}
}

func TestParseHelpSubcommandsAndArguments(t *testing.T) {
	t.Parallel()
	root, subs := parseHelp("ctl", `Operates.

Usage:
  ctl [command]

Available Commands:
  cancel      Cancel a reminder
  completion  Generate the autocompletion script for the specified shell
  help        Help about any command
  migrate     Apply the migrations

Flags:
  -h, --help   help for ctl
`)
	if !slices.Equal(subs, []string{"cancel", "migrate"}) || root.allowArgs {
		t.Errorf("subs %v (want cancel, migrate: not help or completion), allowArgs %v", subs, root.allowArgs)
	}
	cancel, _ := parseHelp("ctl cancel", "Cancels.\n\nUsage:\n  ctl cancel [ID...] [flags]\n\nFlags:\n  -h, --help   help for cancel\n")
	if !cancel.allowArgs {
		t.Error("ctl cancel [ID...] takes arguments")
	}
}
