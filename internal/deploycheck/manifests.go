package deploycheck

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/nudgehq/nudge/deploy/manifest"
)

// document is one YAML document of a manifest file, decoded.
type document struct {
	file string // the file's base name
	doc  obj
}

// where names the document's object, for messages.
func (m document) where() string {
	return fmt.Sprintf("%s: %s %s", m.file, str(m.doc, "kind"), str(m.doc, "metadata", "name"))
}

// readManifests decodes every YAML document in dir's *.yaml files.
func readManifests(dir string) ([]document, []error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, []error{fmt.Errorf("%s: no *.yaml files (%v)", dir, err)}
	}
	var out []document
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		docs, err := manifest.Split(filepath.Base(f), data)
		if err != nil {
			errs = append(errs, err)
		}
		for _, d := range docs {
			var doc obj
			if err := yaml.Unmarshal(d.Data, &doc); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", d, err))
				continue
			}
			if doc != nil {
				out = append(out, document{file: d.File, doc: doc})
			}
		}
	}
	return out, errs
}

// checkKind checks that m's kind is one of kinds (kind → apiVersion), which
// holder ("the base") is expected to hold, with that apiVersion. It reports
// whether the kind is known.
func checkKind(m document, kinds map[string]string, holder string, fail func(where, format string, a ...any)) bool {
	kind, api := str(m.doc, "kind"), str(m.doc, "apiVersion")
	want, ok := kinds[kind]
	if !ok {
		fail(m.where(), "kind %s is not one %s is expected to hold", kind, holder)
		return false
	}
	if api != want {
		fail(m.where(), "apiVersion %s, want %s", api, want)
	}
	return true
}

// checkResourcesListed checks that the resources a kustomization in dir
// lists exist, and that they are every *.yaml file of dir but the
// *.example.* ones, which hold placeholder values and must not be listed.
func checkResourcesListed(dir string, kust obj, fail func(where, format string, a ...any)) {
	listed := map[string]bool{}
	for _, r := range list(kust, "resources") {
		rs := fmt.Sprint(r)
		listed[rs] = true
		if _, err := os.Stat(filepath.Join(dir, rs)); err != nil {
			fail("kustomization.yaml", "resource %s: %v", rs, err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		b := filepath.Base(f)
		switch {
		case b == "kustomization.yaml":
		case strings.Contains(b, ".example."):
			if listed[b] {
				fail("kustomization.yaml", "%s is an example with placeholder values; it must not be a resource", b)
			}
		case !listed[b]:
			fail("kustomization.yaml", "%s is not listed in resources", b)
		}
	}
}

// podTemplate is where a workload keeps its pod template.
func podTemplate(doc obj) (obj, bool) {
	var t any
	switch str(doc, "kind") {
	case "Deployment", "Job":
		t = at(doc, "spec", "template")
	case "CronJob":
		t = at(doc, "spec", "jobTemplate", "spec", "template")
	default:
		return nil, false
	}
	m, _ := t.(obj)
	return m, true
}

// ourImage reports whether image is the Nudge image (any registry, any tag).
func ourImage(image string) bool {
	name, _, _ := strings.Cut(path.Base(image), "@")
	name, _, _ = strings.Cut(name, ":")
	return name == "nudge"
}
