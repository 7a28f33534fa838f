package deploycheck

import (
	"testing"

	"github.com/nudgehq/nudge/deploy/deploytest"
)

func TestNetworkPolicyCheckerCatches(t *testing.T) {
	cs := binaries(t)
	src := k8sTree(t).Base()
	for _, b := range []deploytest.Breakage{
		{Name: "no broker egress", File: "networkpolicy.yaml", Old: "        - protocol: TCP\n          port: 5671\n", New: "",
			Want: "no NetworkPolicy allows egress to TCP 5671, which --amqp-url (from NUDGE_AMQP_URL) needs"},
		{Name: "SMTP port of the URL not allowed", File: "secret.example.yaml", Old: "smtp.example.com:587", New: "smtp.example.com:2525",
			Want: "no NetworkPolicy allows egress to TCP 2525"},
		{Name: "SMTP egress for everyone", File: "networkpolicy.yaml", Old: "  name: nudge-email-worker-smtp\n  labels:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: email-worker\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: nudge\n      app.kubernetes.io/component: email-worker\n",
			New: "  name: nudge-email-worker-smtp\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: nudge\n", Want: "which sms-worker never connects to"},
		{Name: "metrics ingress from anywhere", File: "networkpolicy.yaml", Old: "    - from:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring\n      ports:",
			New: "    - ports:", Want: "an ingress rule without from admits any source"},
		{Name: "ingress to the wrong port", File: "networkpolicy.yaml", Old: "          port: metrics", New: "          port: 9090",
			Want: "admits ingress to TCP 9090, which is not the --listen port 8080"},
		{Name: "ingress to the dispatcher", File: "networkpolicy.yaml", Old: `values: ["email-worker", "sms-worker", "webhook-worker", "reconciler", "planner"]`, New: `values: ["email-worker", "sms-worker", "webhook-worker", "reconciler", "planner", "dispatcher"]`,
			Want: "dispatcher serves nothing"},
		{Name: "no default deny", File: "networkpolicy.yaml", Old: `  policyTypes: ["Ingress", "Egress"]`, New: `  policyTypes: ["Egress"]`,
			Want: "no NetworkPolicy denies by default"},
		{Name: "egress without ports", File: "networkpolicy.yaml", Old: "      ports:\n        - protocol: TCP\n          port: 443\n", New: "",
			Want: "an egress rule without ports allows every port"},
		// Issue 13, finding 9: plain AMQP and any address by port.
		{Name: "plain AMQP", File: "networkpolicy.yaml", Old: "          port: 5671\n", New: "          port: 5671\n        - protocol: TCP\n          port: 5672\n",
			Want: "allows egress to TCP 5672, which"},
		{Name: "egress to any address", File: "networkpolicy.yaml", Old: "    - to:\n        - ipBlock:\n            cidr: 192.0.2.40/32 # CHANGE-ME: the SMS provider's published ranges\n      ports:", New: "    - ports:",
			Want: "an egress rule without to allows every address"},
		{Name: "unbounded pool", File: "secret.example.yaml", Old: "verify-full&pool_max_conns=4\n  NUDGE_AMQP_URL: amqps://nudge-reconciler", New: "verify-full\n  NUDGE_AMQP_URL: amqps://nudge-reconciler",
			Want: "reconciler: --database-url (from NUDGE_DATABASE_URL) must set pool_max_conns"},
		{Name: "pool below concurrency", File: "secret.example.yaml", Old: "sms_worker:CHANGE-ME@postgres.example.internal:5432/nudge?sslmode=verify-full&pool_max_conns=6", New: "sms_worker:CHANGE-ME@postgres.example.internal:5432/nudge?sslmode=verify-full&pool_max_conns=2",
			Want: "pool_max_conns=2 is below --concurrency 4 + 1"},
		{Name: "policy selecting nothing", File: "networkpolicy.yaml", Old: "      app.kubernetes.io/component: sms-worker\n  policyTypes", New: "      app.kubernetes.io/component: sms-wroker\n  policyTypes",
			Want: "podSelector matches no Nudge workload's pods"},
	} {
		t.Run(b.Name, func(t *testing.T) {
			deploytest.WantError(t, checkKustomize(b.Copy(t, src), cs), b.Want)
		})
	}
}

func TestURLPort(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		flag, value string
		want        int
		wantErr     bool
	}{
		{flag: "database-url", value: "postgres://u@db/nudge", want: 5432},
		{flag: "database-url", value: "postgresql://u@db:6432/nudge", want: 6432},
		{flag: "amqp-url", value: "amqp://u@mq/", want: 5672},
		{flag: "amqp-url", value: "amqps://u@mq/nudge", want: 5671},
		{flag: "sms-url", value: "https://sms.example.com/send", want: 443},
		{flag: "sms-url", value: "http://fake-sms:9025", want: 9025},
		{flag: "smtp-url", value: "smtp://mail.example.com", want: 25},
		{flag: "smtp-url", value: "smtps://mail.example.com", want: 465},
		{flag: "smtp-url", value: "smtp://mail.example.com:587", want: 587},
		{flag: "smtp-url", value: "imap://mail.example.com", wantErr: true},
		{flag: "sms-url", value: "ftp://x", wantErr: true},
	} {
		got, err := urlPort(c.flag, c.value)
		if (err != nil) != c.wantErr || got != c.want {
			t.Errorf("urlPort(%s, %s) = %d, %v; want %d (error: %v)", c.flag, c.value, got, err, c.want, c.wantErr)
		}
	}
}
