package deploycheck

import (
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// checkDockerignore checks the build context keeps what the build needs.
func checkDockerignore(ignore string, needed []string) []error {
	type pattern struct {
		glob   string
		negate bool
	}
	var pats []pattern
	for _, line := range strings.Split(ignore, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		p := pattern{glob: t}
		if s, ok := strings.CutPrefix(t, "!"); ok {
			p = pattern{glob: s, negate: true}
		}
		p.glob = strings.Trim(path.Clean(p.glob), "/")
		pats = append(pats, p)
	}
	var errs []error
	for _, n := range needed {
		excluded, by := false, ""
		for _, p := range pats {
			// A pattern excludes the path or any directory above it.
			for q := n; q != "." && q != "/"; q = path.Dir(q) {
				if globMatch(p.glob, q) {
					excluded, by = !p.negate, p.glob
					break
				}
			}
		}
		if excluded {
			errs = append(errs, fmt.Errorf(".dockerignore: %q excludes %s, which the build needs", by, n))
		}
	}
	return errs
}

// globMatch is path.Match plus a leading "**/" (any directories) and "**".
func globMatch(glob, name string) bool {
	if glob == "**" {
		return true
	}
	if rest, ok := strings.CutPrefix(glob, "**/"); ok {
		for {
			if globMatch(rest, name) {
				return true
			}
			_, tail, ok := strings.Cut(name, "/")
			if !ok {
				return false
			}
			name = tail
		}
	}
	ok, _ := path.Match(glob, name)
	return ok
}

// buildInputs lists what go build ./cmd/... reads: go.mod, go.sum and every
// in-module package directory it compiles (with its embedded files).
func buildInputs(root string) ([]string, error) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{range .EmbedFiles}} {{$.Dir}}/{{.}}{{end}}{{end}}", "./cmd/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	need := []string{"go.mod", "go.sum"}
	for _, p := range strings.Fields(string(out)) {
		if rel, err := filepath.Rel(root, p); err == nil && !strings.HasPrefix(rel, "..") {
			need = append(need, filepath.ToSlash(rel))
		}
	}
	return need, nil
}
