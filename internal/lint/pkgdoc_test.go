package lint

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryPackageHasADoc fails when a package (test-only ones aside) has no
// package comment: package docs are where the next engineer learns why.
func TestEveryPackageHasADoc(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..")
	dirs := map[string]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 10 {
		t.Fatalf("found only %d package directories under %s", len(dirs), root)
	}
	for dir := range dirs {
		// Every non-test file of the package is parsed for its package clause
		// and doc; one documented file is enough.
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{} // package name → documented
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				t.Fatalf("parsing %s: %v", file, err)
			}
			names[f.Name.Name] = names[f.Name.Name] || f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != ""
		}
		for name, documented := range names {
			if !documented {
				t.Errorf("package %s in %s has no package comment", name, dir)
			}
		}
	}
}
