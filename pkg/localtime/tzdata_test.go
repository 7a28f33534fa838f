package localtime_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every binary under cmd/ imports time/tzdata, so a minimal image without
// zone files resolves a recipient's zone as a laptop does (LoadZone would
// otherwise fail there for every zone but UTC). Read from the source, so a
// new binary cannot forget it.
func TestEveryBinaryEmbedsTheZoneDatabase(t *testing.T) {
	t.Parallel()
	root := filepath.Join("..", "..", "cmd")
	type pkg struct{ main, tzdata bool }
	pkgs := map[string]*pkg{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir := filepath.Dir(path)
		if pkgs[dir] == nil {
			pkgs[dir] = &pkg{}
		}
		p := pkgs[dir]
		p.main = p.main || f.Name.Name == "main"
		for _, imp := range f.Imports {
			if path, _ := strconv.Unquote(imp.Path.Value); path == "time/tzdata" {
				p.tzdata = true
			}
		}
		return nil
	})
	require.NoError(t, err)
	mains := 0
	for dir, p := range pkgs {
		if !p.main {
			continue
		}
		mains++
		require.True(t, p.tzdata, `%s: package main must import _ "time/tzdata"`, dir)
	}
	require.GreaterOrEqual(t, mains, 6, "found too few binaries under %s", root)
}
