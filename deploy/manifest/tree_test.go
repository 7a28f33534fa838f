package manifest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTree(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, d := range []string{"base", "components/a", "components/b", "overlays/prod"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "components", "README.md"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tree := Tree(dir)
	if got, want := tree.Base(), filepath.Join(dir, "base"); got != want {
		t.Errorf("Base() = %s, want %s", got, want)
	}
	comps, err := tree.Components()
	if want := []string{filepath.Join(dir, "components", "a"), filepath.Join(dir, "components", "b")}; err != nil || !slices.Equal(comps, want) {
		t.Errorf("Components() = %v, %v; want %v", comps, err, want)
	}
	ovs, err := tree.Overlays()
	if want := []string{filepath.Join(dir, "overlays", "prod")}; err != nil || !slices.Equal(ovs, want) {
		t.Errorf("Overlays() = %v, %v; want %v", ovs, err, want)
	}
	if _, err := Tree(filepath.Join(dir, "base")).Overlays(); err == nil || !strings.Contains(err.Error(), "no overlays under") {
		t.Errorf("a tree without overlays: %v, want an error", err)
	}
}
