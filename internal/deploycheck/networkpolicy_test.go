package deploycheck

import (
	"path/filepath"
	"testing"
)

func TestNetworkPolicyCheckerCatches(t *testing.T) {
	cs := binaries(t)
	src := filepath.Join(mustRoot(t), "deploy", "k8s", "base")
	for _, b := range []breakage{
		{name: "no broker egress", file: "networkpolicy.yaml", old: "        - protocol: TCP\n          port: 5671\n", new: "",
			want: "no NetworkPolicy allows egress to TCP 5671, which --amqp-url (from NUDGE_AMQP_URL) needs"},
		{name: "SMTP port of the URL not allowed", file: "secret.example.yaml", old: "smtp.example.com:587", new: "smtp.example.com:2525",
			want: "no NetworkPolicy allows egress to TCP 2525"},
		{name: "SMTP egress for everyone", file: "networkpolicy.yaml", old: "  name: nudge-email-worker-smtp\n  labels:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: email-worker\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: nudge\n      app.kubernetes.io/component: email-worker\n",
			new: "  name: nudge-email-worker-smtp\nspec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: nudge\n", want: "which sms-worker never connects to"},
		{name: "metrics ingress from anywhere", file: "networkpolicy.yaml", old: "    - from:\n        - namespaceSelector:\n            matchLabels:\n              kubernetes.io/metadata.name: monitoring\n      ports:",
			new: "    - ports:", want: "an ingress rule without from admits any source"},
		{name: "ingress to the wrong port", file: "networkpolicy.yaml", old: "          port: metrics", new: "          port: 9090",
			want: "admits ingress to TCP 9090, which is not the --listen port 8080"},
		{name: "ingress to the dispatcher", file: "networkpolicy.yaml", old: `values: ["email-worker", "sms-worker", "reconciler"]`, new: `values: ["email-worker", "sms-worker", "reconciler", "dispatcher"]`,
			want: "dispatcher serves nothing"},
		{name: "no default deny", file: "networkpolicy.yaml", old: `  policyTypes: ["Ingress", "Egress"]`, new: `  policyTypes: ["Egress"]`,
			want: "no NetworkPolicy denies by default"},
		{name: "egress without ports", file: "networkpolicy.yaml", old: "    - ports:\n        - protocol: TCP\n          port: 443\n", new: "    - to:\n        - ipBlock:\n            cidr: 0.0.0.0/0\n",
			want: "an egress rule without ports allows every port"},
		{name: "unbounded pool", file: "secret.example.yaml", old: "verify-full&pool_max_conns=4\n  NUDGE_AMQP_URL: amqps://nudge-reconciler", new: "verify-full\n  NUDGE_AMQP_URL: amqps://nudge-reconciler",
			want: "reconciler: --database-url (from NUDGE_DATABASE_URL) must set pool_max_conns"},
		{name: "pool below concurrency", file: "secret.example.yaml", old: "sms_worker:CHANGE-ME@postgres.example.internal:5432/nudge?sslmode=verify-full&pool_max_conns=6", new: "sms_worker:CHANGE-ME@postgres.example.internal:5432/nudge?sslmode=verify-full&pool_max_conns=2",
			want: "pool_max_conns=2 is below --concurrency 4 + 1"},
		{name: "policy selecting nothing", file: "networkpolicy.yaml", old: "      app.kubernetes.io/component: sms-worker\n  policyTypes", new: "      app.kubernetes.io/component: sms-wroker\n  policyTypes",
			want: "podSelector matches no Nudge workload's pods"},
	} {
		t.Run(b.name, func(t *testing.T) {
			wantError(t, checkKustomize(broken(t, src, b), cs), b.want)
		})
	}
}
