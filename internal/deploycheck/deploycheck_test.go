package deploycheck

import (
	"path/filepath"
	"testing"

	"github.com/nudgehq/nudge/deploy/deploytest"
	"github.com/nudgehq/nudge/deploy/manifest"
)

// Fixtures the tests of several targets share. Each checker's tests hold
// a test of the real files (no errors) and a table of deploytest.Breakage
// cases, each planting one mistake in a copy of a real file, that prove the
// checker can fail.

// binaries builds ./cmd/... (once per test binary) and returns what each
// binary's --help says.
func binaries(t *testing.T) clis {
	t.Helper()
	cs, err := loadBinaries()
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// mustRoot is the main module's root directory.
func mustRoot(t *testing.T) string {
	t.Helper()
	r, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// k8sTree is deploy/k8s.
func k8sTree(t *testing.T) manifest.Tree {
	return manifest.Tree(filepath.Join(mustRoot(t), "deploy", "k8s"))
}

// dirs returns what list (a Tree's Components or Overlays) returns, and
// fails the test on its error.
func dirs(t *testing.T, list func() ([]string, error)) []string {
	t.Helper()
	dirs, err := list()
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// baseInfoOf inspects the real base, which must have no errors.
func baseInfoOf(t *testing.T, cs clis) *baseInfo {
	t.Helper()
	b, errs := inspectBase(k8sTree(t).Base(), cs)
	deploytest.NoErrors(t, errs)
	return b
}
