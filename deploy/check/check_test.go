package check

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nudgehq/nudge/deploy/deploytest"
	"github.com/nudgehq/nudge/deploy/manifest"
)

// k8sDir is deploy/k8s, seen from this package's directory.
var (
	k8sDir = filepath.Join("..", "k8s")
	tree   = manifest.Tree(k8sDir)
)

// render builds dir with kustomize and decodes every object it renders.
func render(t *testing.T, dir string) ([]any, []error) {
	t.Helper()
	out, err := Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := manifest.Split("kustomize build "+dir, out)
	if err != nil {
		t.Fatal(err)
	}
	return DecodeAll(docs)
}

// rendered is render, its decoding errors reported.
func rendered(t *testing.T, dir string) []any {
	t.Helper()
	objs, errs := render(t, dir)
	deploytest.NoErrors(t, errs)
	return objs
}

// ruleErrors loads the rules of every PrometheusRule of a file.
func ruleErrors(t *testing.T, file string) []error {
	t.Helper()
	objs, errs := DecodeFile(file)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var ruleErrs []error
	for _, o := range objs {
		if pr, ok := o.(*monitoringv1.PrometheusRule); ok {
			ruleErrs = append(ruleErrs, CheckRules(pr)...)
		}
	}
	return ruleErrs
}

func TestSourceManifestsDecodeStrictly(t *testing.T) {
	t.Parallel()
	files, errs := DecodeTree(k8sDir)
	deploytest.NoErrors(t, errs)
	n := 0
	for _, objs := range files {
		n += len(objs)
	}
	if n < 20 {
		t.Fatalf("decoded only %d objects under %s", n, k8sDir)
	}
	t.Logf("%d files, %d objects decoded strictly", len(files), n)
}

func TestKustomizeBuildsBase(t *testing.T) {
	t.Parallel()
	objs := rendered(t, tree.Base())
	if len(objs) < 10 {
		t.Fatalf("the base rendered only %d objects", len(objs))
	}
}

// checkRendered checks what kustomize rendered for an overlay: the overlay's
// namespace and image apply everywhere, the rules load, and (for the example
// overlay) the components are there and their patches took effect. Kustomize
// silently ignores a patch whose target matches nothing, so the patch's
// effect is what is checked.
func checkRendered(overlay string, objs []any) []error {
	var errs []error
	count := map[string]int{}
	for _, o := range objs {
		switch v := o.(type) {
		case *scaledObject:
			count["ScaledObject"]++
		case *monitoringv1.ServiceMonitor:
			count["ServiceMonitor"]++
		case *monitoringv1.PrometheusRule:
			count["PrometheusRule"]++
			errs = append(errs, CheckRules(v)...)
		case *appsv1.Deployment:
			count["Deployment"]++
			if v.Spec.Replicas != nil && slices.Contains([]string{"nudge-email-worker", "nudge-sms-worker", "nudge-webhook-worker"}, v.Name) && overlay == "example" {
				errs = append(errs, fmt.Errorf("Deployment %s keeps replicas %d although KEDA scales it: the autoscaling component's patch did not apply", v.Name, *v.Spec.Replicas))
			}
			for _, c := range v.Spec.Template.Spec.Containers {
				if !strings.Contains(c.Image, "/") || !strings.Contains(c.Image, ":") {
					errs = append(errs, fmt.Errorf("Deployment %s runs image %q: the overlay must pin a registry and tag", v.Name, c.Image))
				}
			}
		}
		if mo, ok := o.(metav1.Object); ok && mo.GetNamespace() == "nudge" {
			errs = append(errs, fmt.Errorf("%T %s stayed in the base's namespace: the overlay's namespace did not apply", o, mo.GetName()))
		}
	}
	if overlay == "example" {
		for _, kind := range []string{"ScaledObject", "ServiceMonitor", "PrometheusRule", "Deployment"} {
			want := map[string]int{"ScaledObject": 4, "ServiceMonitor": 5, "PrometheusRule": 1, "Deployment": 5}[kind]
			if count[kind] != want {
				errs = append(errs, fmt.Errorf("the example overlay renders %d %s, want %d", count[kind], kind, want))
			}
		}
	}
	return errs
}

func TestKustomizeBuildsOverlays(t *testing.T) {
	t.Parallel()
	dirs, err := tree.Overlays()
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			deploytest.NoErrors(t, checkRendered(filepath.Base(dir), rendered(t, dir)))
		})
	}
}

func TestPrometheusRulesLoad(t *testing.T) {
	t.Parallel()
	files, errs := DecodeTree(filepath.Join(k8sDir, "components"))
	for _, err := range errs {
		t.Fatal(err)
	}
	rules := 0
	for _, objs := range files {
		for _, o := range objs {
			if pr, ok := o.(*monitoringv1.PrometheusRule); ok {
				deploytest.NoErrors(t, CheckRules(pr))
				for _, g := range pr.Spec.Groups {
					rules += len(g.Rules)
				}
			}
		}
	}
	if rules == 0 {
		t.Fatal("no PrometheusRule with rules under deploy/k8s/components")
	}
}

// The checks fail on a deliberately broken copy of the manifests.
func TestChecksCatchBrokenManifests(t *testing.T) {
	t.Parallel()
	for _, b := range []deploytest.Breakage{
		{Name: "unknown field", File: "base/email-worker.yaml", Old: "terminationGracePeriodSeconds: 40", New: "terminationGracePeriodSecond: 40",
			Want: `unknown field "spec.template.spec.terminationGracePeriodSecond"`},
		{Name: "misplaced field", File: "base/reconciler.yaml", Old: "      terminationGracePeriodSeconds: 30\n", New: "      terminationGracePeriodSeconds: 30\n      readOnlyRootFilesystem: true\n",
			Want: `unknown field "spec.template.spec.readOnlyRootFilesystem"`},
		{Name: "duplicate field", File: "base/configmap.yaml", Old: "  NUDGE_LOG_LEVEL: info\n", New: "  NUDGE_LOG_LEVEL: info\n  NUDGE_LOG_LEVEL: debug\n",
			Want: "NUDGE_LOG_LEVEL"},
		{Name: "bad quantity", File: "base/sms-worker.yaml", Old: "memory: 256Mi", New: "memory: 256 megabytes",
			Want: "quantities must match"},
		{Name: "wrong type", File: "base/dispatcher-cronjob.yaml", Old: "startingDeadlineSeconds: 30", New: "startingDeadlineSeconds: thirty",
			Want: "startingDeadlineSeconds"},
		{Name: "unknown kind", File: "base/namespace.yaml", Old: "kind: Namespace", New: "kind: Namespaces",
			Want: `no kind "Namespaces"`},
		{Name: "unknown kustomize field", File: "overlays/example/kustomization.yaml", Old: "components:", New: "component:",
			Want: `unknown field "component"`},
		{Name: "KEDA field misspelt", File: "components/autoscaling/scaledobjects.yaml", Old: "minReplicaCount: 2", New: "minReplicas: 2",
			Want: `unknown field "minReplicas"`},
		{Name: "KEDA metadata not a string", File: "components/autoscaling/scaledobjects.yaml", Old: `value: "10"`, New: `value: 10`,
			Want: "cannot unmarshal number into Go struct field scaleTriggers.spec.triggers.metadata of type string"},
		{Name: "ServiceMonitor field misspelt", File: "components/monitoring/servicemonitors.yaml", Old: "  endpoints:", New: "  endpoint:",
			Want: `unknown field "spec.endpoint"`},
	} {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			_, errs := DecodeFile(filepath.Join(b.Copy(t, k8sDir), filepath.FromSlash(b.File)))
			deploytest.WantError(t, errs, b.Want)
		})
	}

	t.Run("rendered overlay", func(t *testing.T) {
		t.Parallel()
		b := deploytest.Breakage{Name: "rendered overlay", File: "base/email-worker.yaml", Old: "terminationGracePeriodSeconds: 40", New: "terminationGracePeriodSecond: 40",
			Want: `unknown field "spec.template.spec.terminationGracePeriodSecond"`}
		_, errs := render(t, filepath.Join(b.Copy(t, k8sDir), "overlays", "example"))
		deploytest.WantError(t, errs, b.Want)
	})

	t.Run("kustomize build fails", func(t *testing.T) {
		t.Parallel()
		b := deploytest.Breakage{Name: "kustomize build fails", File: "components/autoscaling/kustomization.yaml", Old: "  - scaledobjects.yaml", New: "  - scaledobject.yaml"}
		_, err := Build(filepath.Join(b.Copy(t, k8sDir), "overlays", "example"))
		if err == nil {
			t.Fatal("kustomize build succeeded with a missing resource")
		}
		t.Logf("caught: %v", err)
	})

	t.Run("patch that matches nothing", func(t *testing.T) {
		t.Parallel()
		b := deploytest.Breakage{Name: "patch that matches nothing", File: "components/autoscaling/kustomization.yaml", Old: "name: nudge-sms-worker", New: "name: nudge-sms-wroker",
			Want: "Deployment nudge-sms-worker keeps replicas 2 although KEDA scales it"}
		deploytest.WantError(t, checkRendered("example", rendered(t, filepath.Join(b.Copy(t, k8sDir), "overlays", "example"))), b.Want)
	})

	t.Run("bad PromQL", func(t *testing.T) {
		t.Parallel()
		b := deploytest.Breakage{Name: "bad PromQL", File: "components/monitoring/prometheusrule.yaml", Old: "(nudge_reconcile_lag_seconds) > 120", New: "(nudge_reconcile_lag_seconds > 120", Want: "unclosed left parenthesis"}
		deploytest.WantError(t, ruleErrors(t, filepath.Join(b.Copy(t, k8sDir), filepath.FromSlash(b.File))), b.Want)
	})

	t.Run("bad template", func(t *testing.T) {
		t.Parallel()
		b := deploytest.Breakage{Name: "bad template", File: "components/monitoring/prometheusrule.yaml", Old: "The {{ $labels.channel }} dead-letter queue", New: "The {{ $labels.channel dead-letter queue", Want: "annotation \"description\""}
		deploytest.WantError(t, ruleErrors(t, filepath.Join(b.Copy(t, k8sDir), filepath.FromSlash(b.File))), b.Want)
	})
}
