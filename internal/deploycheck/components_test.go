package deploycheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/nudgehq/nudge/deploy/deploytest"
)

func TestKustomizeComponents(t *testing.T) {
	base := baseInfoOf(t, binaries(t))
	kinds := map[string]bool{}
	for _, d := range dirs(t, k8sTree(t).Components) {
		deploytest.NoErrors(t, checkComponent(d, base))
		docs, _ := readManifests(d)
		for _, m := range docs {
			kinds[str(m.doc, "kind")] = true
		}
	}
	for _, k := range []string{"ScaledObject", "ServiceMonitor", "PrometheusRule"} {
		if !kinds[k] {
			t.Errorf("no component holds a %s", k)
		}
	}
	for _, o := range dirs(t, k8sTree(t).Overlays) {
		deploytest.NoErrors(t, checkOverlayComponents(o))
	}
}

func TestComponentCheckerCatches(t *testing.T) {
	base := baseInfoOf(t, binaries(t))
	root := filepath.Join(string(k8sTree(t)), "components")
	for _, b := range []deploytest.Breakage{
		{Name: "wrong queue", File: "autoscaling/scaledobjects.yaml", Old: "queueName: nudge.sms", New: "queueName: nudge.email",
			Want: `trigger queueName "nudge.email", but sms-worker consumes nudge.sms`},
		{Name: "unknown target", File: "autoscaling/scaledobjects.yaml", Old: "    name: nudge-email-worker\n  minReplicaCount", New: "    name: nudge-mail-worker\n  minReplicaCount",
			Want: `scaleTargetRef.name "nudge-mail-worker" is not a Deployment of the base`},
		{Name: "scale to zero", File: "autoscaling/scaledobjects.yaml", Old: "minReplicaCount: 2", New: "minReplicaCount: 0", Want: "minReplicaCount must be at least 1"},
		{Name: "replicas kept", File: "autoscaling/kustomization.yaml", Old: "      name: nudge-sms-worker\n", New: "      name: nudge-reconciler\n",
			Want: "must remove spec.replicas from nudge-sms-worker"},
		{Name: "password inline", File: "autoscaling/scaledobjects.yaml", Old: "        protocol: amqp\n        queueName: nudge.email", New: "        protocol: amqp\n        host: amqp://u:p@rabbitmq/nudge\n        queueName: nudge.email",
			Want: "take it from a TriggerAuthentication"},
		{Name: "management API", File: "autoscaling/scaledobjects.yaml", Old: "        protocol: amqp\n        queueName: nudge.sms", New: "        protocol: http\n        queueName: nudge.sms",
			Want: `trigger protocol "http", want amqp`},
		{Name: "secret key not shown", File: "autoscaling/scaledobjects.yaml", Old: "      key: host", New: "      key: url", Want: "reads key url of Secret nudge-keda"},
		{Name: "monitor selects nothing", File: "monitoring/servicemonitors.yaml", Old: "      app.kubernetes.io/component: reconciler\n  endpoints", New: "      app.kubernetes.io/component: reconcilor\n  endpoints",
			Want: "must match exactly one Service of the base, matches 0"},
		{Name: "monitor on an unnamed port", File: "monitoring/servicemonitors.yaml", Old: "    - port: metrics", New: "    - port: http", Want: `endpoint port "http" is not a port name`},
		{Name: "alert without severity", File: "monitoring/prometheusrule.yaml", Old: "            severity: critical\n          annotations:\n            summary: \"Reminders due", New: "            team: nudge\n          annotations:\n            summary: \"Reminders due",
			Want: "alert NudgeOldestDueReminderTooOld: labels.severity"},
		{Name: "metric not covered", File: "monitoring/prometheusrule.yaml", Old: "max by (namespace) (nudge_reconcile_lag_seconds)", New: "max by (namespace) (nudge_reconcile_lag)",
			Want: "no alert uses nudge_reconcile_lag_seconds"},
		{Name: "bad for", File: "monitoring/prometheusrule.yaml", Old: "          for: 5m\n          labels:\n            severity: warning", New: "          for: 5 minutes\n          labels:\n            severity: warning",
			Want: `for "5 minutes"`},
		{Name: "runbook elsewhere", File: "monitoring/prometheusrule.yaml", Old: "docs/runbook.md#nudgereconcilelagging",
			New: "docs/operations.md", Want: "alert NudgeReconcileLagging: runbook_url"},
		{Name: "unlisted resource", File: "monitoring/kustomization.yaml", Old: "  - prometheusrule.yaml\n", New: "", Want: "prometheusrule.yaml is not listed in resources"},
		{Name: "console flag misspelt", File: "console/console.yaml", Old: "--token-file=/etc", New: "--tokenfile=/etc", Want: "tokenfile"},
		{Name: "console token not mounted", File: "console/console.yaml", Old: "mountPath: /etc/nudge-console", New: "mountPath: /etc/nudge",
			Want: "--token-file /etc/nudge-console/token is in no volume mount"},
		{Name: "console token key not shown", File: "console/console.yaml", Old: "              - key: token", New: "              - key: console-token",
			Want: "reads key console-token of Secret nudge-console-token"},
		{Name: "console secret not shown", File: "console/console.yaml", Old: "                name: nudge-console\n", New: "                name: nudge-konsole\n",
			Want: "envFrom"},
		{Name: "console as root", File: "console/console.yaml", Old: "runAsNonRoot: true", New: "runAsNonRoot: false", Want: "runAsNonRoot must be true"},
		{Name: "console service selects nothing", File: "console/console.yaml", Old: "  selector:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: console",
			New: "  selector:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: konsole", Want: "matches no Deployment of the component"},
		{Name: "unknown kind", File: "monitoring/servicemonitors.yaml", Old: "kind: ServiceMonitor", New: "kind: PodMonitor", Want: "kind PodMonitor is not one"},
	} {
		t.Run(b.Name, func(t *testing.T) {
			comp, _, _ := strings.Cut(b.File, "/")
			deploytest.WantError(t, checkComponent(filepath.Join(b.Copy(t, root), comp), base), b.Want)
		})
	}
}

// Issue 17: every alert's runbook_url pointed at docs/operations.md, which
// has no section per alert. Each now points at its own section of
// docs/runbook.md ("### NudgeSomething"), which must exist.
func TestEveryAlertHasItsRunbookSection(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	rules, err := os.ReadFile(filepath.Join(root, "deploy", "k8s", "components", "monitoring", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	runbook, err := os.ReadFile(filepath.Join(root, "docs", "runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllStringSubmatch(string(rules), -1)
	if len(alerts) < 5 {
		t.Fatalf("found %d alerts", len(alerts))
	}
	for _, a := range alerts {
		if !regexp.MustCompile(`(?m)^### ` + a[1] + `$`).Match(runbook) {
			t.Errorf("docs/runbook.md has no section \"### %s\" for its runbook_url", a[1])
		}
	}
}
