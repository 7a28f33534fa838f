package testenv

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BinariesAt builds the given commands (directory names under cmd/, e.g.
// "dispatcher") as the module was at commit, taken from the git history of
// the checkout the test runs in, and returns the directory holding them (a
// temporary directory of the test). Nothing is cached in the repository: the
// source is extracted with git archive into a temporary directory, removed
// after the build, and built with -trimpath so that the Go build cache serves
// every run after the first whatever that directory's name.
//
// Without git, or without commit in the history (a shallow clone), the test
// fails under CI=true and skips otherwise, saying why.
func BinariesAt(tb testing.TB, commit string, cmds ...string) string {
	tb.Helper()
	needs(tb, "git and the binaries of an earlier commit")
	if _, err := exec.LookPath("git"); err != nil {
		Unavailable(tb, "git", "install git: the binaries of commit "+commit+" are built from the history", err)
		return ""
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		tb.Fatalf("finding the module root: %v", err)
	}
	modDir := filepath.Dir(strings.TrimSpace(string(out)))
	// The module's directory inside the repository ("" at its root).
	prefix, err := exec.Command("git", "-C", modDir, "rev-parse", "--show-prefix").Output()
	if err != nil {
		Unavailable(tb, "a git checkout at "+modDir, "run the test in a clone, not an exported tree", gitErr(err))
		return ""
	}
	full, err := exec.Command("git", "-C", modDir, "rev-parse", "--verify", "--quiet", commit+"^{commit}").Output()
	if err != nil {
		Unavailable(tb, "commit "+commit+" in the git history of "+modDir,
			"fetch the history: git fetch --unshallow (CI: a checkout with fetch-depth 0)", gitErr(err))
		return ""
	}
	sha := strings.TrimSpace(string(full))

	src, err := os.MkdirTemp("", "nudge-src-"+sha[:12]+"-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(src)
	start := time.Now()
	archive, err := exec.Command("git", "-C", modDir, "archive", "--format=tar", sha).Output()
	if err != nil {
		tb.Fatalf("git archive %s: %v", sha, gitErr(err))
	}
	if err := untar(bytes.NewReader(archive), src); err != nil {
		tb.Fatalf("extracting commit %s: %v", sha, err)
	}

	bin := buildCommands(tb, filepath.Join(src, strings.TrimSpace(string(prefix))), cmds)
	tb.Logf("built %s of commit %s in %s", strings.Join(cmds, ", "), sha[:12], time.Since(start).Round(100*time.Millisecond))
	return bin
}

// BinariesOf builds the given commands of this tree, as BinariesAt builds
// an earlier commit's (-trimpath: packages unchanged since that commit come
// from the build cache), into a temporary directory of the test.
func BinariesOf(tb testing.TB, cmds ...string) string {
	tb.Helper()
	needs(tb, "the binaries built and the services they connect to")
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		tb.Fatalf("finding the module root: %v", err)
	}
	start := time.Now()
	bin := buildCommands(tb, filepath.Dir(strings.TrimSpace(string(out))), cmds)
	tb.Logf("built %s of this tree in %s", strings.Join(cmds, ", "), time.Since(start).Round(100*time.Millisecond))
	return bin
}

// buildCommands builds ./cmd/NAME of the module in dir for each name into a
// temporary directory of the test, without symbol table and DWARF (-s -w:
// linking, all a cached build does, costs half the CPU; stack traces keep
// their file and line).
func buildCommands(tb testing.TB, dir string, cmds []string) string {
	tb.Helper()
	bin := tb.TempDir()
	args := []string{"build", "-trimpath", "-ldflags=-s -w", "-o", bin + "/"}
	for _, c := range cmds {
		args = append(args, "./cmd/"+c)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if msg, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("in %s: go %s: %v\n%s", dir, strings.Join(args, " "), err, msg)
	}
	return bin
}

// gitErr adds git's own message to err.
func gitErr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}

// untar writes the regular files and directories of a tar stream under dir.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(name, filepath.Clean(dir)+string(os.PathSeparator)) {
			return fmt.Errorf("tar entry %q leaves the directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777|0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, name); err != nil {
				return err
			}
		}
	}
}
