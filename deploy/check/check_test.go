package check

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// k8sDir is deploy/k8s, seen from this package's directory.
var k8sDir = filepath.Join("..", "k8s")

func overlays(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob(filepath.Join(k8sDir, "overlays", "*"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no overlays under %s (%v)", k8sDir, err)
	}
	return dirs
}

// rendered builds dir with kustomize and decodes every object it renders.
func rendered(t *testing.T, dir string) []any {
	t.Helper()
	out, err := Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := SplitDocuments("kustomize build "+dir, out)
	if err != nil {
		t.Fatal(err)
	}
	var objs []any
	for _, d := range docs {
		o, err := Decode(d)
		if err != nil {
			t.Error(err)
			continue
		}
		objs = append(objs, o)
	}
	return objs
}

func TestSourceManifestsDecodeStrictly(t *testing.T) {
	t.Parallel()
	files, errs := DecodeTree(k8sDir)
	for _, err := range errs {
		t.Error(err)
	}
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
	objs := rendered(t, filepath.Join(k8sDir, "base"))
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
			if v.Spec.Replicas != nil && slices.Contains([]string{"nudge-email-worker", "nudge-sms-worker"}, v.Name) && overlay == "example" {
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
			want := map[string]int{"ScaledObject": 2, "ServiceMonitor": 3, "PrometheusRule": 1, "Deployment": 3}[kind]
			if count[kind] != want {
				errs = append(errs, fmt.Errorf("the example overlay renders %d %s, want %d", count[kind], kind, want))
			}
		}
	}
	return errs
}

func TestKustomizeBuildsOverlays(t *testing.T) {
	t.Parallel()
	for _, dir := range overlays(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			for _, err := range checkRendered(filepath.Base(dir), rendered(t, dir)) {
				t.Error(err)
			}
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
				for _, err := range CheckRules(pr) {
					t.Error(err)
				}
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

// copyTree copies deploy/k8s to a temporary directory, for breaking.
func copyTree(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(k8sDir, func(path string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(k8sDir, path)
		if e.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func replaceIn(t *testing.T, file, old, new string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(old)) {
		t.Fatalf("%s no longer contains %q: update this case", file, old)
	}
	if err := os.WriteFile(file, bytes.Replace(data, []byte(old), []byte(new), 1), 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, errs []error, want string) {
	t.Helper()
	for _, e := range errs {
		if strings.Contains(e.Error(), want) {
			t.Logf("caught: %v", e)
			return
		}
	}
	t.Errorf("no error mentions %q; got %v", want, errs)
}

// The checks fail on a deliberately broken copy of the manifests.
func TestChecksCatchBrokenManifests(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, file, old, new, want string
	}{
		{"unknown field", "base/email-worker.yaml", "terminationGracePeriodSeconds: 40", "terminationGracePeriodSecond: 40",
			`unknown field "spec.template.spec.terminationGracePeriodSecond"`},
		{"misplaced field", "base/reconciler.yaml", "      terminationGracePeriodSeconds: 30\n", "      terminationGracePeriodSeconds: 30\n      readOnlyRootFilesystem: true\n",
			`unknown field "spec.template.spec.readOnlyRootFilesystem"`},
		{"duplicate field", "base/configmap.yaml", "  NUDGE_LOG_LEVEL: info\n", "  NUDGE_LOG_LEVEL: info\n  NUDGE_LOG_LEVEL: debug\n", "NUDGE_LOG_LEVEL"},
		{"bad quantity", "base/sms-worker.yaml", "memory: 256Mi", "memory: 256 megabytes", "quantities must match"},
		{"wrong type", "base/dispatcher-cronjob.yaml", "startingDeadlineSeconds: 30", "startingDeadlineSeconds: thirty", "startingDeadlineSeconds"},
		{"unknown kind", "base/namespace.yaml", "kind: Namespace", "kind: Namespaces", `no kind "Namespaces"`},
		{"unknown kustomize field", "overlays/example/kustomization.yaml", "components:", "component:", `unknown field "component"`},
		{"KEDA field misspelt", "components/autoscaling/scaledobjects.yaml", "minReplicaCount: 2", "minReplicas: 2", `unknown field "minReplicas"`},
		{"KEDA metadata not a string", "components/autoscaling/scaledobjects.yaml", `value: "500"`, `value: 500`, "cannot unmarshal number into Go struct field scaleTriggers.spec.triggers.metadata of type string"},
		{"ServiceMonitor field misspelt", "components/monitoring/servicemonitors.yaml", "  endpoints:", "  endpoint:", `unknown field "spec.endpoint"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := copyTree(t)
			file := filepath.Join(dir, filepath.FromSlash(c.file))
			replaceIn(t, file, c.old, c.new)
			_, errs := DecodeFile(file)
			wantErr(t, errs, c.want)
		})
	}

	t.Run("rendered overlay", func(t *testing.T) {
		t.Parallel()
		dir := copyTree(t)
		replaceIn(t, filepath.Join(dir, "base", "email-worker.yaml"), "terminationGracePeriodSeconds: 40", "terminationGracePeriodSecond: 40")
		out, err := Build(filepath.Join(dir, "overlays", "example"))
		if err != nil {
			t.Fatal(err)
		}
		docs, err := SplitDocuments("rendered", out)
		if err != nil {
			t.Fatal(err)
		}
		var errs []error
		for _, d := range docs {
			if _, err := Decode(d); err != nil {
				errs = append(errs, err)
			}
		}
		wantErr(t, errs, `unknown field "spec.template.spec.terminationGracePeriodSecond"`)
	})

	t.Run("kustomize build fails", func(t *testing.T) {
		t.Parallel()
		dir := copyTree(t)
		replaceIn(t, filepath.Join(dir, "components", "autoscaling", "kustomization.yaml"), "  - scaledobjects.yaml", "  - scaledobject.yaml")
		_, err := Build(filepath.Join(dir, "overlays", "example"))
		if err == nil {
			t.Fatal("kustomize build succeeded with a missing resource")
		}
		t.Logf("caught: %v", err)
	})

	t.Run("patch that matches nothing", func(t *testing.T) {
		t.Parallel()
		dir := copyTree(t)
		replaceIn(t, filepath.Join(dir, "components", "autoscaling", "kustomization.yaml"), "name: nudge-sms-worker", "name: nudge-sms-wroker")
		wantErr(t, checkRendered("example", rendered(t, filepath.Join(dir, "overlays", "example"))),
			"Deployment nudge-sms-worker keeps replicas 2 although KEDA scales it")
	})

	t.Run("bad PromQL", func(t *testing.T) {
		t.Parallel()
		dir := copyTree(t)
		file := filepath.Join(dir, "components", "monitoring", "prometheusrule.yaml")
		replaceIn(t, file, "(nudge_reconcile_lag_seconds) > 120", "(nudge_reconcile_lag_seconds > 120")
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
		wantErr(t, ruleErrs, "unclosed left parenthesis")
	})

	t.Run("bad template", func(t *testing.T) {
		t.Parallel()
		dir := copyTree(t)
		file := filepath.Join(dir, "components", "monitoring", "prometheusrule.yaml")
		replaceIn(t, file, "The {{ $labels.channel }} dead-letter queue", "The {{ $labels.channel dead-letter queue")
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
		wantErr(t, ruleErrs, "annotation \"description\"")
	})
}
