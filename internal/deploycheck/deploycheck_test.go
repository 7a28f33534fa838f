package deploycheck

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func binaries(t *testing.T) clis {
	t.Helper()
	cs, err := loadBinaries()
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func mustRoot(t *testing.T) string {
	t.Helper()
	r, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func baseInfoOf(t *testing.T, cs clis) *baseInfo {
	t.Helper()
	b, errs := inspectBase(filepath.Join(mustRoot(t), "deploy", "k8s", "base"), cs)
	requireNoErrors(t, errs)
	return b
}

func componentDirs(t *testing.T) []string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(mustRoot(t), "deploy", "k8s", "components", "*"))
	if len(dirs) == 0 {
		t.Fatal("no components in deploy/k8s/components")
	}
	return dirs
}

// Tests of the real files.
func requireNoErrors(t *testing.T, errs []error) {
	t.Helper()
	for _, err := range errs {
		t.Error(err)
	}
}

// The checkers catch mistakes: each case breaks a copy of a real file.
type breakage struct {
	name     string
	file     string // relative to the copied directory
	old, new string
	want     string // a substring of one of the errors
}

// broken copies src (a file or a directory) to a temp dir, applies b, and
// returns the copy's path.
func broken(t *testing.T, src string, b breakage) string {
	t.Helper()
	dst := t.TempDir()
	info, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	if info.IsDir() {
		files, _ := filepath.Glob(filepath.Join(src, "*"))
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dst, filepath.Base(f)), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst = filepath.Join(dst, filepath.Base(src))
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	target := dst
	if info.IsDir() {
		target = filepath.Join(dst, b.file)
	}
	data, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(b.old)) {
		t.Fatalf("%s no longer contains %q: update this case", b.file, b.old)
	}
	data = bytes.Replace(data, []byte(b.old), []byte(b.new), 1)
	if err := os.WriteFile(target, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

func wantError(t *testing.T, errs []error, want string) {
	t.Helper()
	for _, e := range errs {
		if strings.Contains(e.Error(), want) {
			t.Logf("caught: %v", e)
			return
		}
	}
	t.Errorf("no error mentions %q; got %v", want, errs)
}

// unavailable fails under CI=true and skips loudly otherwise (as testenv does).
func unavailable(t *testing.T, what string, err error) {
	t.Helper()
	msg := fmt.Sprintf("INTEGRATION TEST NOT RUN: %s: %v", what, err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip("\n\n*** " + msg + " ***\n")
}
