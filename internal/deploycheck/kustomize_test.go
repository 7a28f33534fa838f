package deploycheck

import (
	"path/filepath"
	"testing"
)

func TestKustomizeBase(t *testing.T) {
	requireNoErrors(t, checkKustomize(filepath.Join(mustRoot(t), "deploy", "k8s", "base"), binaries(t)))
}

func TestKustomizeOverlays(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(mustRoot(t), "deploy", "k8s", "overlays", "*"))
	if len(dirs) == 0 {
		t.Fatal("no overlays in deploy/k8s/overlays")
	}
	for _, d := range dirs {
		requireNoErrors(t, checkOverlay(d))
	}
}

func TestKustomizeCheckerCatches(t *testing.T) {
	cs := binaries(t)
	src := filepath.Join(mustRoot(t), "deploy", "k8s", "base")
	for _, b := range []breakage{
		{name: "bogus flag", file: "reconciler.yaml", old: `"--every=10s"`, new: `"--evrey=10s"`, want: "reconciler has no flag --evrey"},
		{name: "bogus variable", file: "email-worker.yaml", old: "          envFrom:", new: "          env:\n            - name: NUDGE_GRACE_PERIOD\n              value: 25s\n          envFrom:", want: "NUDGE_GRACE_PERIOD is not the variable of any flag of email-worker"},
		{name: "unread shared key", file: "configmap.yaml", old: "  NUDGE_LOG_LEVEL: info", new: "  NUDGE_LOG_LEVL: info", want: "NUDGE_LOG_LEVL is not the variable of a flag of any container"},
		{name: "shared key with two meanings", file: "configmap.yaml", old: "  NUDGE_LOG_LEVEL: info", new: "  NUDGE_LOG_LEVEL: info\n  NUDGE_BATCH: \"100\"", want: "NUDGE_BATCH means different things"},
		{name: "looping CronJob", file: "dispatcher-cronjob.yaml", old: `"--budget=4m"`, new: `"--budget=4m", "--every=5s"`, want: "a CronJob must exit"},
		{name: "budget over deadline", file: "dispatcher-cronjob.yaml", old: `"--budget=4m"`, new: `"--budget=6m"`, want: "must be below activeDeadlineSeconds 300"},
		{name: "send outlives the drain", file: "email-worker.yaml", old: `"--send-timeout=20s"`, new: `"--send-timeout=30s"`, want: "--send-timeout 30s (from --send-timeout) must be below --grace 25s"},
		{name: "grace over termination period", file: "sms-worker.yaml", old: `"--grace=25s"`, new: `"--grace=45s"`, want: "must be below terminationGracePeriodSeconds 40"},
		{name: "probe on the wrong port", file: "reconciler.yaml", old: `"--listen=:8080"`, new: `"--listen=:9090"`, want: "must be the --listen port (9090)"},
		{name: "wrong probe path", file: "email-worker.yaml", old: "path: /readyz", new: "path: /healthz", want: "readinessProbe path"},
		{name: "writable root", file: "reconciler.yaml", old: "readOnlyRootFilesystem: true", new: "readOnlyRootFilesystem: false", want: "readOnlyRootFilesystem must be true"},
		{name: "root user", file: "migrate-job.yaml", old: "runAsUser: 65532", new: "runAsUser: 0", want: "runAsUser must be 65532"},
		{name: "no resource limits", file: "dispatcher-cronjob.yaml", old: "                limits:\n                  cpu: \"1\"\n", new: "                limits:\n", want: "resources.limits.cpu must be set"},
		{name: "service links", file: "sms-worker.yaml", old: "enableServiceLinks: false", new: "enableServiceLinks: true", want: "enableServiceLinks must be false"},
		{name: "unlisted resource", file: "kustomization.yaml", old: "  - reconciler.yaml\n", new: "", want: "reconciler.yaml is not listed in resources"},
		{name: "example secret deployed", file: "kustomization.yaml", old: "  - reconciler.yaml\n", new: "  - reconciler.yaml\n  - secret.example.yaml\n", want: "must not be a resource"},
		{name: "unknown kind", file: "namespace.yaml", old: "kind: Namespace", new: "kind: Namespaces", want: "kind Namespaces is not one"},
		{name: "missing name", file: "configmap.yaml", old: "name: nudge-config", new: "labelz: x", want: "lacks apiVersion, kind or metadata.name"},
		{name: "unknown binary", file: "migrate-job.yaml", old: `["nudgectl", "migrate",`, new: `["nudge-ctl", "migrate",`, want: `"nudge-ctl" is not a binary`},
		{name: "migration does not declare", file: "migrate-job.yaml", old: `["nudgectl", "migrate", "--declare-topology"]`, new: `["nudgectl", "migrate"]`,
			want: "must run `nudgectl migrate --declare-topology`"},
		{name: "a worker declares", file: "sms-worker.yaml", old: `"--grace=25s"`, new: `"--grace=25s", "--declare-topology"`,
			want: "--declare-topology (from --declare-topology) needs configure permission"},
		{name: "declaring by environment", file: "configmap.yaml", old: "  NUDGE_LOG_LEVEL: info", new: "  NUDGE_LOG_LEVEL: info\n  NUDGE_DECLARE_TOPOLOGY: \"true\"",
			want: "--declare-topology (from NUDGE_DECLARE_TOPOLOGY) needs configure permission"},
		{name: "migration cannot reach the broker", file: "networkpolicy.yaml", old: `values: ["migrate", "dispatcher",`, new: `values: ["dispatcher",`,
			want: "no NetworkPolicy allows egress to TCP 5671"},
		{name: "selector matches nothing", file: "email-worker.yaml", old: "kind: Service\nmetadata:\n  name: nudge-email-worker\n  labels:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: email-worker\nspec:\n  selector:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: email-worker", new: "kind: Service\nmetadata:\n  name: nudge-email-worker\nspec:\n  selector:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: emailworker", want: "matches no Deployment's pods"},
	} {
		t.Run(b.name, func(t *testing.T) {
			wantError(t, checkKustomize(broken(t, src, b), cs), b.want)
		})
	}
}
