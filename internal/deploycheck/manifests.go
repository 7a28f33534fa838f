package deploycheck

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

type manifest struct {
	file string
	doc  obj
}

func (m manifest) where() string {
	return fmt.Sprintf("%s: %s %s", m.file, str(m.doc, "kind"), str(m.doc, "metadata", "name"))
}

// readManifests decodes every YAML document in dir's *.yaml files.
func readManifests(dir string) ([]manifest, []error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		return nil, []error{fmt.Errorf("%s: no *.yaml files (%v)", dir, err)}
	}
	var out []manifest
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for i := 1; ; i++ {
			var doc obj
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: %w", filepath.Base(f), i, err))
				break
			}
			if doc != nil {
				out = append(out, manifest{file: filepath.Base(f), doc: doc})
			}
		}
	}
	return out, errs
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
