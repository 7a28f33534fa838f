package deploycheck

import (
	"testing"

	"github.com/nudgehq/nudge/deploy/deploytest"
)

func TestKustomizeBase(t *testing.T) {
	deploytest.NoErrors(t, checkKustomize(k8sTree(t).Base(), binaries(t)))
}

func TestKustomizeOverlays(t *testing.T) {
	for _, d := range dirs(t, k8sTree(t).Overlays) {
		deploytest.NoErrors(t, checkOverlay(d))
	}
}

func TestKustomizeCheckerCatches(t *testing.T) {
	cs := binaries(t)
	src := k8sTree(t).Base()
	for _, b := range []deploytest.Breakage{
		{Name: "bogus flag", File: "reconciler.yaml", Old: `"--every=10s"`, New: `"--evrey=10s"`, Want: "reconciler has no flag --evrey"},
		{Name: "bogus variable", File: "email-worker.yaml", Old: "          envFrom:", New: "          env:\n            - name: NUDGE_GRACE_PERIOD\n              value: 25s\n          envFrom:", Want: "NUDGE_GRACE_PERIOD is not the variable of any flag of email-worker"},
		{Name: "unread shared key", File: "configmap.yaml", Old: "  NUDGE_LOG_LEVEL: info", New: "  NUDGE_LOG_LEVL: info", Want: "NUDGE_LOG_LEVL is not the variable of a flag of any container"},
		{Name: "shared key with two meanings", File: "configmap.yaml", Old: "  NUDGE_LOG_LEVEL: info", New: "  NUDGE_LOG_LEVEL: info\n  NUDGE_BATCH: \"100\"", Want: "NUDGE_BATCH means different things"},
		{Name: "looping CronJob", File: "dispatcher-cronjob.yaml", Old: `"--budget=4m"`, New: `"--budget=4m", "--every=5s"`, Want: "a CronJob must exit"},
		{Name: "budget over deadline", File: "dispatcher-cronjob.yaml", Old: `"--budget=4m"`, New: `"--budget=6m"`, Want: "must be below activeDeadlineSeconds 300"},
		{Name: "send outlives the drain", File: "email-worker.yaml", Old: `"--send-timeout=20s"`, New: `"--send-timeout=30s"`, Want: "--send-timeout 30s (from --send-timeout) must be below --grace 25s"},
		{Name: "grace over termination period", File: "sms-worker.yaml", Old: `"--grace=25s"`, New: `"--grace=45s"`, Want: "must be below terminationGracePeriodSeconds 40"},
		{Name: "probe on the wrong port", File: "reconciler.yaml", Old: `"--listen=:8080"`, New: `"--listen=:9090"`, Want: "must be the --listen port (9090)"},
		{Name: "wrong probe path", File: "email-worker.yaml", Old: "path: /readyz", New: "path: /healthz", Want: "readinessProbe path"},
		{Name: "writable root", File: "reconciler.yaml", Old: "readOnlyRootFilesystem: true", New: "readOnlyRootFilesystem: false", Want: "readOnlyRootFilesystem must be true"},
		{Name: "root user", File: "migrate-job.yaml", Old: "runAsUser: 65532", New: "runAsUser: 0", Want: "runAsUser must be 65532"},
		{Name: "no resource limits", File: "dispatcher-cronjob.yaml", Old: "                limits:\n                  cpu: \"1\"\n", New: "                limits:\n", Want: "resources.limits.cpu must be set"},
		{Name: "service links", File: "sms-worker.yaml", Old: "enableServiceLinks: false", New: "enableServiceLinks: true", Want: "enableServiceLinks must be false"},
		{Name: "unlisted resource", File: "kustomization.yaml", Old: "  - reconciler.yaml\n", New: "", Want: "reconciler.yaml is not listed in resources"},
		{Name: "example secret deployed", File: "kustomization.yaml", Old: "  - reconciler.yaml\n", New: "  - reconciler.yaml\n  - secret.example.yaml\n", Want: "must not be a resource"},
		{Name: "wrong apiVersion", File: "migrate-job.yaml", Old: "apiVersion: batch/v1", New: "apiVersion: batch/v1beta1", Want: "apiVersion batch/v1beta1, want batch/v1"},
		{Name: "unknown kind", File: "namespace.yaml", Old: "kind: Namespace", New: "kind: Namespaces", Want: "kind Namespaces is not one"},
		{Name: "missing name", File: "configmap.yaml", Old: "name: nudge-config", New: "labelz: x", Want: "lacks apiVersion, kind or metadata.name"},
		{Name: "unknown binary", File: "migrate-job.yaml", Old: `["nudgectl", "migrate",`, New: `["nudge-ctl", "migrate",`, Want: `"nudge-ctl" is not a binary`},
		{Name: "migration does not declare", File: "migrate-job.yaml", Old: `["nudgectl", "migrate", "--declare-topology"]`, New: `["nudgectl", "migrate"]`,
			Want: "must run `nudgectl migrate --declare-topology`"},
		{Name: "a worker declares", File: "sms-worker.yaml", Old: `"--grace=25s"`, New: `"--grace=25s", "--declare-topology"`,
			Want: "--declare-topology (from --declare-topology) needs configure permission"},
		{Name: "declaring by environment", File: "configmap.yaml", Old: "  NUDGE_LOG_LEVEL: info", New: "  NUDGE_LOG_LEVEL: info\n  NUDGE_DECLARE_TOPOLOGY: \"true\"",
			Want: "--declare-topology (from NUDGE_DECLARE_TOPOLOGY) needs configure permission"},
		{Name: "migration cannot reach the broker", File: "networkpolicy.yaml", Old: `values: ["migrate", "dispatcher",`, New: `values: ["dispatcher",`,
			Want: "no NetworkPolicy allows egress to TCP 5671"},
		{Name: "selector matches nothing", File: "email-worker.yaml", Old: "kind: Service\nmetadata:\n  name: nudge-email-worker\n  labels:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: email-worker\nspec:\n  selector:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: email-worker", New: "kind: Service\nmetadata:\n  name: nudge-email-worker\nspec:\n  selector:\n    app.kubernetes.io/name: nudge\n    app.kubernetes.io/component: emailworker", Want: "matches no Deployment's pods"},
	} {
		t.Run(b.Name, func(t *testing.T) {
			deploytest.WantError(t, checkKustomize(b.Copy(t, src), cs), b.Want)
		})
	}
}
