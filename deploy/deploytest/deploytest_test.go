package deploytest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that records failures instead of failing, so
// that the helpers' own failures can be tested.
type recorder struct {
	testing.TB // nil: calling anything not overridden panics
	failures   []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Logf(string, ...any)       {}
func (r *recorder) Error(a ...any)            { r.failures = append(r.failures, fmt.Sprint(a...)) }
func (r *recorder) Errorf(f string, a ...any) { r.failures = append(r.failures, fmt.Sprintf(f, a...)) }
func (r *recorder) Fatalf(f string, a ...any) { r.Errorf(f, a...); runtime.Goexit() }

// run calls f with a recorder, in a goroutine of its own as Fatalf needs.
func run(f func(tb testing.TB)) []string {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.failures
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestCopyDirectory(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "k8s")
	write(t, filepath.Join(src, "base", "a.yaml"), "x: 1\nx: 1\n")
	write(t, filepath.Join(src, "overlays", "prod", "b.yaml"), "y: 2\n")
	dst := Breakage{File: "base/a.yaml", Old: "x: 1", New: "x: 9"}.Copy(t, src)
	if got := read(t, filepath.Join(dst, "base", "a.yaml")); got != "x: 9\nx: 1\n" {
		t.Errorf("broken copy holds %q, want only the first occurrence replaced", got)
	}
	if got := read(t, filepath.Join(dst, "overlays", "prod", "b.yaml")); got != "y: 2\n" {
		t.Errorf("a nested file was copied as %q", got)
	}
	if got := read(t, filepath.Join(src, "base", "a.yaml")); got != "x: 1\nx: 1\n" {
		t.Errorf("the original changed: %q", got)
	}
}

func TestCopyFile(t *testing.T) {
	t.Parallel()
	src := filepath.Join(t.TempDir(), "compose.yml")
	write(t, src, "image: nudge\n")
	dst := Breakage{Old: "nudge", New: "other"}.Copy(t, src)
	if filepath.Base(dst) != "compose.yml" || read(t, dst) != "image: other\n" {
		t.Errorf("copy %s holds %q", dst, read(t, dst))
	}
}

func TestApplyFailsWhenTheFileChanged(t *testing.T) {
	t.Parallel()
	got := run(func(tb testing.TB) { Breakage{Name: "bogus flag", Old: "--every"}.Apply(tb, "Dockerfile", "FROM x\n") })
	if len(got) != 1 || !strings.Contains(got[0], `Dockerfile no longer contains "--every": update the case "bogus flag"`) {
		t.Errorf("failures %q", got)
	}
}

func TestWantError(t *testing.T) {
	t.Parallel()
	errs := []error{errors.New("a: fine"), errors.New("b: port 9026 is wrong")}
	if got := run(func(tb testing.TB) { WantError(tb, errs, "port 9026") }); len(got) != 0 {
		t.Errorf("a matching error: failures %q", got)
	}
	if got := run(func(tb testing.TB) { WantError(tb, errs, "port 9027") }); len(got) != 1 || !strings.Contains(got[0], `no error mentions "port 9027"`) {
		t.Errorf("no matching error: failures %q", got)
	}
	if got := run(func(tb testing.TB) { WantError(tb, nil, "x") }); len(got) != 1 {
		t.Errorf("no errors at all: failures %q", got)
	}
}

func TestNoErrors(t *testing.T) {
	t.Parallel()
	if got := run(func(tb testing.TB) { NoErrors(tb, []error{errors.New("one"), errors.New("two")}) }); len(got) != 2 {
		t.Errorf("failures %q, want one per error", got)
	}
	if got := run(func(tb testing.TB) { NoErrors(tb, nil) }); len(got) != 0 {
		t.Errorf("failures %q, want none", got)
	}
}
