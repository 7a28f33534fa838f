package deploycheck

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestKustomizeComponents(t *testing.T) {
	base := baseInfoOf(t, binaries(t))
	kinds := map[string]bool{}
	for _, d := range componentDirs(t) {
		requireNoErrors(t, checkComponent(d, base))
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
	overlays, _ := filepath.Glob(filepath.Join(mustRoot(t), "deploy", "k8s", "overlays", "*"))
	for _, o := range overlays {
		requireNoErrors(t, checkOverlayComponents(o))
	}
}

func TestComponentCheckerCatches(t *testing.T) {
	base := baseInfoOf(t, binaries(t))
	root := filepath.Join(mustRoot(t), "deploy", "k8s", "components")
	for _, b := range []breakage{
		{name: "wrong queue", file: "autoscaling/scaledobjects.yaml", old: "queueName: nudge.sms", new: "queueName: nudge.email",
			want: `trigger queueName "nudge.email", but sms-worker consumes nudge.sms`},
		{name: "unknown target", file: "autoscaling/scaledobjects.yaml", old: "    name: nudge-email-worker\n  minReplicaCount", new: "    name: nudge-mail-worker\n  minReplicaCount",
			want: `scaleTargetRef.name "nudge-mail-worker" is not a Deployment of the base`},
		{name: "scale to zero", file: "autoscaling/scaledobjects.yaml", old: "minReplicaCount: 2", new: "minReplicaCount: 0", want: "minReplicaCount must be at least 1"},
		{name: "replicas kept", file: "autoscaling/kustomization.yaml", old: "      name: nudge-sms-worker\n", new: "      name: nudge-reconciler\n",
			want: "must remove spec.replicas from nudge-sms-worker"},
		{name: "password inline", file: "autoscaling/scaledobjects.yaml", old: "        protocol: amqp\n        queueName: nudge.email", new: "        protocol: amqp\n        host: amqp://u:p@rabbitmq/nudge\n        queueName: nudge.email",
			want: "take it from a TriggerAuthentication"},
		{name: "management API", file: "autoscaling/scaledobjects.yaml", old: "        protocol: amqp\n        queueName: nudge.sms", new: "        protocol: http\n        queueName: nudge.sms",
			want: `trigger protocol "http", want amqp`},
		{name: "secret key not shown", file: "autoscaling/scaledobjects.yaml", old: "      key: host", new: "      key: url", want: "reads key url of Secret nudge-keda"},
		{name: "monitor selects nothing", file: "monitoring/servicemonitors.yaml", old: "      app.kubernetes.io/component: reconciler\n  endpoints", new: "      app.kubernetes.io/component: reconcilor\n  endpoints",
			want: "must match exactly one Service of the base, matches 0"},
		{name: "monitor on an unnamed port", file: "monitoring/servicemonitors.yaml", old: "    - port: metrics", new: "    - port: http", want: `endpoint port "http" is not a port name`},
		{name: "alert without severity", file: "monitoring/prometheusrule.yaml", old: "            severity: critical\n          annotations:\n            summary: \"Reminders due", new: "            team: nudge\n          annotations:\n            summary: \"Reminders due",
			want: "alert NudgeOldestDueReminderTooOld: labels.severity"},
		{name: "metric not covered", file: "monitoring/prometheusrule.yaml", old: "max by (namespace) (nudge_reconcile_lag_seconds)", new: "max by (namespace) (nudge_reconcile_lag)",
			want: "no alert uses nudge_reconcile_lag_seconds"},
		{name: "bad for", file: "monitoring/prometheusrule.yaml", old: "          for: 5m\n          labels:\n            severity: warning", new: "          for: 5 minutes\n          labels:\n            severity: warning",
			want: `for "5 minutes"`},
		{name: "unlisted resource", file: "monitoring/kustomization.yaml", old: "  - prometheusrule.yaml\n", new: "", want: "prometheusrule.yaml is not listed in resources"},
		{name: "unknown kind", file: "monitoring/servicemonitors.yaml", old: "kind: ServiceMonitor", new: "kind: PodMonitor", want: "kind PodMonitor is not one"},
	} {
		t.Run(b.name, func(t *testing.T) {
			comp, file, _ := strings.Cut(b.file, "/")
			b.file = file
			wantError(t, checkComponent(broken(t, filepath.Join(root, comp), b), base), b.want)
		})
	}
}
