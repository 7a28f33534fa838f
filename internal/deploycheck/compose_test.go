package deploycheck

import (
	"path/filepath"
	"testing"
)

func TestCompose(t *testing.T) {
	requireNoErrors(t, checkCompose(filepath.Join(mustRoot(t), "docker-compose.yml"), binaries(t)))
}

func TestComposeCheckerCatches(t *testing.T) {
	cs := binaries(t)
	src := filepath.Join(mustRoot(t), "docker-compose.yml")
	for _, b := range []breakage{
		{name: "bogus flag", old: `"--every", "5s"`, new: `"--evry", "5s"`, want: "dispatcher has no flag --evry"},
		{name: "bogus variable", old: "NUDGE_SMTP_URL:", new: "NUDGE_SMTP_URI:", want: "NUDGE_SMTP_URI is not the variable of any flag of email-worker (did you mean NUDGE_SMTP_URL?)"},
		{name: "variable of another binary", old: "NUDGE_FAKE_SMS_TOKEN:", new: "NUDGE_SMS_TOKEN:", want: "NUDGE_SMS_TOKEN is not the variable of any flag of fake-sms"},
		{name: "unknown binary", old: `["dispatcher",`, new: `["dispatch",`, want: `"dispatch" is not a binary`},
		{name: "missing subcommand", old: `["nudgectl", "migrate",`, new: `["nudgectl",`, want: "nudgectl needs a subcommand"},
		{name: "nobody declares the topology", old: `["nudgectl", "migrate", "--declare-topology"]`, new: `["nudgectl", "migrate"]`,
			want: "service migrate must run `nudgectl migrate --declare-topology`: [dispatcher email-worker reconciler sms-worker] only check"},
		{name: "declarer has no broker", old: "      NUDGE_AMQP_URL: amqp://nudge:nudge@rabbitmq:5672/\n    depends_on:\n      postgres:", new: "    depends_on:\n      postgres:",
			want: "--amqp-url (from default) points at \"127.0.0.1\", which is not a service"},
		{name: "bad duration", old: `"--every", "5s"`, new: `"--every", "5 seconds"`, want: `--every (from --every) = "5 seconds"`},
		{name: "bad signing key", old: "dev:change-me-0123456789abcdef", new: "dev:short", want: "secret must be at least"},
		{name: "bad SMTP URL", old: "smtp://mailpit:1025?tls=none", new: "smtp://mailpit:1025?tls=nope", want: "--smtp-url"},
		{name: "URL to no service", old: "http://fake-sms:9025", new: "http://localhost:9025", want: `points at "localhost", which is not a service`},
		{name: "URL to the wrong port", old: "http://fake-sms:9025", new: "http://fake-sms:9026", want: "points at port 9026, but fake-sms listens on 0.0.0.0:9025"},
		{name: "loopback listener", old: `"--listen", "0.0.0.0:9025"`, new: `"--listen", "127.0.0.1:9025"`, want: "other containers cannot reach"},
		{name: "migrate not awaited", old: "condition: service_completed_successfully", new: "condition: service_started", want: "must wait for migrate with condition service_completed_successfully"},
		{name: "broker not awaited", old: "  rabbitmq:\n    condition: service_healthy", new: "  rabbitmq:\n    condition: service_started", want: "must wait for rabbitmq with condition service_healthy"},
		{name: "migrate restarts", old: `restart: "no"`, new: `restart: on-failure`, want: `restart: "no"`},
		{name: "short stop grace", old: "stop_grace_period: 30s", new: "stop_grace_period: 20s", want: "stop_grace_period 20s must exceed --grace 25s"},
		{name: "send outlives the drain", old: `["email-worker", "--send-timeout", "20s"]`, new: `["email-worker"]`, want: "--send-timeout 30s (from default) must be below --grace 25s (from default)"},
		{name: "missing required flag", old: "  NUDGE_SIGNING_KEYS: dev:change-me-0123456789abcdef\n", new: "\n", want: "--signing-keys is required"},
	} {
		t.Run(b.name, func(t *testing.T) {
			wantError(t, checkCompose(broken(t, src, b), cs), b.want)
		})
	}
}
