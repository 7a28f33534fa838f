package lint

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTrackedFilesCheck runs scripts/check-tracked-files.sh, which `make test`
// runs on the repository itself, on a throwaway repository: it passes on
// sources, goes red on a committed executable and on a file over 1 MiB, and
// lets an allow-listed data file through.
func TestTrackedFilesCheck(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	script, err := filepath.Abs(filepath.Join("..", "..", "scripts", "check-tracked-files.sh"))
	if err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	write := func(name string, data []byte) {
		t.Helper()
		path := filepath.Join(repo, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		git("add", name)
	}
	check := func() (bool, string) {
		t.Helper()
		var out bytes.Buffer
		cmd := exec.Command("bash", script, repo)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if _, exit := err.(*exec.ExitError); err != nil && !exit {
			t.Fatalf("running %s: %v", script, err)
		}
		return err == nil, out.String()
	}

	git("init", "-q")
	write("main.go", []byte("package main\n"))
	if ok, out := check(); !ok {
		t.Fatalf("sources only: check failed:\n%s", out)
	}

	write("bench/nudge-bench", append([]byte{0x7f, 'E', 'L', 'F'}, make([]byte, 64)...))
	if ok, out := check(); ok || !strings.Contains(out, "bench/nudge-bench") {
		t.Fatalf("a tracked ELF binary: check passed or did not name it:\n%s", out)
	}
	git("rm", "-q", "--cached", "bench/nudge-bench")

	write("data/big.csv", bytes.Repeat([]byte("a,b\n"), 300_000))
	if ok, out := check(); ok || !strings.Contains(out, "data/big.csv") {
		t.Fatalf("a tracked 1.2 MB file: check passed or did not name it:\n%s", out)
	}
	write("scripts/tracked-files.allow", []byte("# fixture the tests need\ndata/big.csv\n"))
	if ok, out := check(); !ok {
		t.Fatalf("an allow-listed large file: check failed:\n%s", out)
	}
}
