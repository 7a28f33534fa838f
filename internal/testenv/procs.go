package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildMu sync.Mutex
	builds  = map[string]string{}
)

// Binaries builds every command of the module with the given build tags
// (once per test process and tag set) and returns the directory holding them.
// Tests that crash real processes build with "faultinject".
func Binaries(tb testing.TB, tags ...string) string {
	tb.Helper()
	needs(tb, "the binaries built and the services they connect to")
	key := strings.Join(tags, ",")
	buildMu.Lock()
	defer buildMu.Unlock()
	if dir, ok := builds[key]; ok {
		return dir
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		tb.Fatalf("finding the module root: %v", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	dir, err := os.MkdirTemp("", "nudge-bin-")
	if err != nil {
		tb.Fatal(err)
	}
	args := []string{"build", "-o", dir + "/"}
	if key != "" {
		args = append(args, "-tags", key)
	}
	args = append(args, "./cmd/...")
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	builds[key] = dir
	return dir
}

// Proc is a Nudge binary running as a separate process.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	log  *bytes.Buffer
	mu   *sync.Mutex
	done chan struct{}
	err  error
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Start runs dir/bin with args and the extra environment; the process is
// killed when the test ends, and its output is logged if the test failed.
func Start(tb testing.TB, dir, bin string, env []string, args ...string) *Proc {
	tb.Helper()
	p := &Proc{Name: bin, log: &bytes.Buffer{}, mu: &sync.Mutex{}, done: make(chan struct{})}
	p.cmd = exec.Command(filepath.Join(dir, bin), args...)
	p.cmd.Env = append(os.Environ(), env...)
	w := lockedWriter{mu: p.mu, w: p.log}
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("starting %s: %v", bin, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if tb.Failed() {
			tb.Logf("--- output of %s %v:\n%s", bin, args, p.Output())
		}
	})
	return p
}

// Output is what the process printed so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Wait waits up to timeout for the process to exit and returns its exit code
// (-1 with killed set when a signal ended it).
func (p *Proc) Wait(tb testing.TB, timeout time.Duration) (code int, signaled syscall.Signal) {
	tb.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		tb.Fatalf("%s did not exit within %s; output:\n%s", p.Name, timeout, p.Output())
	}
	ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return -1, ws.Signal()
	}
	return p.cmd.ProcessState.ExitCode(), 0
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// String names the process for messages.
func (p *Proc) String() string { return fmt.Sprintf("%s (pid %d)", p.Name, p.cmd.Process.Pid) }
