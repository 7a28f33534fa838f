package check

import (
	"bytes"
	stdjson "encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/nudgehq/nudge/deploy/manifest"
)

// scheme holds every API type Nudge's manifests may use. A kind outside it
// is an error: add its group here when a manifest needs one.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme, appsv1.AddToScheme, batchv1.AddToScheme, policyv1.AddToScheme,
		networkingv1.AddToScheme, monitoringv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// strict decodes YAML into the scheme's types, failing on unknown and
// duplicate fields as `kubectl apply --validate=strict` does.
var strict = json.NewSerializerWithOptions(json.DefaultMetaFactory, scheme, scheme,
	json.SerializerOptions{Yaml: true, Strict: true})

// Decode decodes one document strictly into its real type and returns it:
// a kustomize Kustomization or Component, a KEDA object, or an object of
// the scheme.
func Decode(d manifest.Document) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(d.Data, &tm); err != nil {
		return nil, fmt.Errorf("%s: %w", d, err)
	}
	if tm.APIVersion == "" || tm.Kind == "" {
		return nil, fmt.Errorf("%s: no apiVersion or kind", d)
	}
	var obj any
	var err error
	switch group, _, _ := strings.Cut(tm.APIVersion, "/"); {
	case group == "kustomize.config.k8s.io":
		var k types.Kustomization
		err = yaml.UnmarshalStrict(d.Data, &k)
		obj = &k
	case tm.APIVersion == "keda.sh/v1alpha1" && tm.Kind == "ScaledObject":
		obj, err = decodeCustom[scaledObject](d.Data)
	case tm.APIVersion == "keda.sh/v1alpha1" && tm.Kind == "TriggerAuthentication":
		obj, err = decodeCustom[triggerAuthentication](d.Data)
	default:
		obj, _, err = strict.Decode(d.Data, nil, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("%s (%s %s): %w", d, tm.APIVersion, tm.Kind, err)
	}
	return obj, nil
}

// decodeCustom decodes a custom resource the way the API server sees it:
// YAML to JSON first, without the Go type's help (sigs.k8s.io/yaml would turn
// a number into the string a field wants; the server's schema refuses it),
// then strictly: duplicate keys and unknown fields are errors.
func decodeCustom[T any](data []byte) (*T, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, err
	}
	dec := stdjson.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	var v T
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return &v, nil
}

// DecodeFile decodes every document of a file.
func DecodeFile(path string) ([]any, []error) {
	docs, err := manifest.ReadFile(path)
	if err != nil {
		return nil, []error{err}
	}
	return DecodeAll(docs)
}

// DecodeAll decodes documents, going on past the ones that fail.
func DecodeAll(docs []manifest.Document) ([]any, []error) {
	var objs []any
	var errs []error
	for _, d := range docs {
		o, err := Decode(d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, o)
	}
	return objs, errs
}

// DecodeTree decodes every *.yaml file under dir.
func DecodeTree(dir string) (map[string][]any, []error) {
	out := map[string][]any{}
	var errs []error
	err := filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		objs, es := DecodeFile(path)
		out[path] = objs
		errs = append(errs, es...)
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	return out, errs
}

// Build runs `kustomize build dir` in-process and returns the rendered YAML.
func Build(dir string) ([]byte, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return out, nil
}

// CheckRules loads a PrometheusRule's groups with Prometheus's own rule
// loader (rulefmt), as Prometheus would load them from a rule file: every
// expression is parsed as PromQL, every label and annotation template is
// parsed, and unknown fields are errors.
func CheckRules(pr *monitoringv1.PrometheusRule) []error {
	// The operator hands Prometheus the spec, marshalled, as a rule file
	// (groups: [...]); so does this.
	file, err := yaml.Marshal(pr.Spec)
	if err != nil {
		return []error{err}
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	_, errs := rulefmt.Parse(file, false, model.LegacyValidation, parser.NewParser(parser.Options{}), logger)
	for i, e := range errs {
		errs[i] = fmt.Errorf("PrometheusRule %s: %w", pr.Name, e)
	}
	return errs
}
