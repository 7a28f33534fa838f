package deploycheck

import (
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nudgehq/nudge/deploy/deploytest"
)

func TestCompose(t *testing.T) {
	deploytest.NoErrors(t, checkCompose(filepath.Join(mustRoot(t), "docker-compose.yml"), binaries(t)))
}

func TestComposeCheckerCatches(t *testing.T) {
	cs := binaries(t)
	src := filepath.Join(mustRoot(t), "docker-compose.yml")
	for _, b := range []deploytest.Breakage{
		{Name: "bogus flag", Old: `"--every", "5s"`, New: `"--evry", "5s"`, Want: "dispatcher has no flag --evry"},
		{Name: "bogus variable", Old: "NUDGE_SMTP_URL:", New: "NUDGE_SMTP_URI:", Want: "NUDGE_SMTP_URI is not the variable of any flag of email-worker (did you mean NUDGE_SMTP_URL?)"},
		{Name: "variable of another binary", Old: "NUDGE_FAKE_SMS_TOKEN:", New: "NUDGE_SMS_TOKEN:", Want: "NUDGE_SMS_TOKEN is not the variable of any flag of fake-sms"},
		{Name: "unknown binary", Old: `["dispatcher",`, New: `["dispatch",`, Want: `"dispatch" is not a binary`},
		{Name: "missing subcommand", Old: `["nudgectl", "migrate",`, New: `["nudgectl",`, Want: "nudgectl needs a subcommand"},
		{Name: "nobody declares the topology", Old: `["nudgectl", "migrate", "--declare-topology", "--after-rollout"]`, New: `["nudgectl", "migrate", "--after-rollout"]`,
			Want: "service migrate must run `nudgectl migrate --declare-topology`: [dispatcher email-worker planner reconciler sms-worker webhook-worker] only check"},
		{Name: "declarer has no broker", Old: "      NUDGE_AMQP_URL: amqp://nudge:nudge@rabbitmq:5672/\n    depends_on:\n      postgres:", New: "    depends_on:\n      postgres:",
			Want: "--amqp-url (from default) points at \"127.0.0.1\", which is not a service"},
		{Name: "bad duration", Old: `"--every", "5s"`, New: `"--every", "5 seconds"`, Want: `--every (from --every) = "5 seconds"`},
		{Name: "bad signing key", Old: "dev:compose-dev-signing-key-0123456789abcdef", New: "dev:short", Want: "secret must be at least"},
		{Name: "bad SMTP URL", Old: "smtp://mailpit:1025?tls=none", New: "smtp://mailpit:1025?tls=nope", Want: "--smtp-url"},
		{Name: "URL to no service", Old: "http://fake-sms:9025", New: "http://localhost:9025", Want: `points at "localhost", which is not a service`},
		{Name: "URL to the wrong port", Old: "http://fake-sms:9025", New: "http://fake-sms:9026", Want: "points at port 9026, but fake-sms listens on 0.0.0.0:9025"},
		{Name: "failover provider URL to no service", Old: "      NUDGE_SMS_TOKEN: dev-sms-token\n      NUDGE_LISTEN", New: "      NUDGE_SMS_TOKEN: dev-sms-token\n      NUDGE_SMS_PROVIDERS: twilio,generic\n      NUDGE_LISTEN",
			Want: `--twilio-url (from default) points at "api.twilio.com"`},
		{Name: "loopback listener", Old: `"--listen", "0.0.0.0:9025"`, New: `"--listen", "127.0.0.1:9025"`, Want: "other containers cannot reach"},
		{Name: "migrate not awaited", Old: "condition: service_completed_successfully", New: "condition: service_started", Want: "must wait for migrate with condition service_completed_successfully"},
		{Name: "broker not awaited", Old: "  rabbitmq:\n    condition: service_healthy", New: "  rabbitmq:\n    condition: service_started", Want: "must wait for rabbitmq with condition service_healthy"},
		{Name: "migrate restarts", Old: `restart: "no"`, New: `restart: on-failure`, Want: `restart: "no"`},
		{Name: "short stop grace", Old: "stop_grace_period: 30s", New: "stop_grace_period: 20s", Want: "stop_grace_period 20s must exceed --grace 25s"},
		{Name: "send outlives the drain", Old: `["email-worker", "--send-timeout", "20s"]`, New: `["email-worker"]`, Want: "--send-timeout 30s (from default) must be below --grace 25s (from default)"},
		{Name: "worker keys not derived from the root keys", Old: "NUDGE_SIGNING_KEYS: dev@sms:b3", New: "NUDGE_SIGNING_KEYS: dev@sms:c3",
			Want: "service sms-worker: --signing-keys (from NUDGE_SIGNING_KEYS) are neither dispatcher's root keys nor the sms keys derived from them"},
		{Name: "worker holds the other channel's keys", Old: "NUDGE_SIGNING_KEYS: dev@sms:b3b435cad27bf3168aa3d792088110e53c7d4f179c91e14e6593ddc451b70496",
			New:  "NUDGE_SIGNING_KEYS: dev@email:dab1057a8f11aceff6add0b79b7a11d39d7e95d85eea35da5c0c95fb07066af3",
			Want: "service sms-worker: --signing-keys"},
		{Name: "planner holds a worker's keys", Old: "NUDGE_SIGNING_KEYS: dev@plan:084c5531e1a30651bc7e89faa5a47bab2fca0e22469d3c365a12152b1c9d1078",
			New:  "NUDGE_SIGNING_KEYS: dev@email:dab1057a8f11aceff6add0b79b7a11d39d7e95d85eea35da5c0c95fb07066af3",
			Want: "service planner: --signing-keys (from NUDGE_SIGNING_KEYS) are neither dispatcher's root keys nor the plan keys derived from them"},
		{Name: "missing required flag", Old: "  NUDGE_SIGNING_KEYS: dev:compose-dev-signing-key-0123456789abcdef\n", New: "\n", Want: "--signing-keys is required"},
	} {
		t.Run(b.Name, func(t *testing.T) {
			deploytest.WantError(t, checkCompose(b.Copy(t, src), cs), b.Want)
		})
	}
}

func TestComposeWords(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in      any
		want    []string
		wantErr string
	}{
		{in: nil},
		{in: "dispatcher --every 5s", want: []string{"dispatcher", "--every", "5s"}},
		{in: []any{"dispatcher", "--every", "5s"}, want: []string{"dispatcher", "--every", "5s"}},
		{in: `sh -c "dispatcher"`, wantErr: "write the command as a list"},
		{in: "dispatcher $FLAGS", wantErr: "write the command as a list"},
		{in: []any{"dispatcher", 5}, wantErr: "command word 5 is not a string"},
		{in: map[string]any{}, wantErr: "command of type map"},
	} {
		got, err := words(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("words(%#v): error %v, want %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("words(%#v) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestComposeEnv(t *testing.T) {
	t.Parallel()
	want := map[string]envValue{"A": {val: "1", known: true}, "B": {}, "C": {val: "", known: true}}
	for _, in := range []any{
		map[string]any{"A": 1, "B": nil, "C": ""},
		[]any{"A=1", "B", "C="},
	} {
		got, err := composeEnv(in)
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("composeEnv(%#v) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := composeEnv("A=1"); err == nil {
		t.Error("environment as a string: no error")
	}
}

func TestComposeDeps(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   any
		want map[string]string
	}{
		{in: nil, want: map[string]string{}},
		{in: []any{"postgres", "rabbitmq"}, want: map[string]string{"postgres": "service_started", "rabbitmq": "service_started"}},
		{in: map[string]any{"postgres": map[string]any{"condition": "service_healthy"}, "migrate": map[string]any{"restart": true}},
			want: map[string]string{"postgres": "service_healthy", "migrate": "service_started"}},
	} {
		if got := composeDeps(c.in); !maps.Equal(got, c.want) {
			t.Errorf("composeDeps(%#v) = %v, want %v", c.in, got, c.want)
		}
	}
}
