package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The memory benchmark runs the real binaries, each a process of its own,
// because a worker's footprint is what a Kubernetes memory limit is set
// from, and nothing in-process can tell one component's share of the
// harness's heap: the harness builds cmd/sms-worker and cmd/dispatcher with
// `go build` into a temporary directory and reads VmHWM (the peak resident
// set) from /proc/<pid>/status just before stopping each. Not ru_maxrss at
// exit: os/exec starts a child by a vfork-style clone, and the kernel carries
// the high-water mark of the memory the child shared until execve (the
// harness's own) into it, so ru_maxrss reports at least the harness's RSS.

// binaries are the real worker and dispatcher, built once per harness run.
type binaries struct{ dir, worker, dispatcher string }

// buildBinaries builds cmd/sms-worker and cmd/dispatcher of the repository
// at repo into a new temporary directory; remove deletes it.
func buildBinaries(ctx context.Context, repo string) (*binaries, error) {
	dir, err := os.MkdirTemp("", "nudge-bench-bin-")
	if err != nil {
		return nil, fmt.Errorf("building the binaries: %w", err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-o", dir+string(filepath.Separator),
		"./cmd/sms-worker", "./cmd/dispatcher")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("go build ./cmd/sms-worker ./cmd/dispatcher in %s: %w\n%s", repo, err, out)
	}
	return &binaries{dir: dir, worker: filepath.Join(dir, "sms-worker"), dispatcher: filepath.Join(dir, "dispatcher")}, nil
}

func (b *binaries) remove() { _ = os.RemoveAll(b.dir) }

// child is one Nudge process the harness started.
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the process was reaped
	waitErr error
	// Last readings from /proc while it ran.
	peakMiB, cpuSec float64
}

// startChild starts bin with args and an environment holding no NUDGE_*
// variable but the given ones (flags set everything else), logging to
// logPath. The process gets SIGTERM if the harness dies.
func startChild(name, bin, logPath string, args []string, nudgeEnv ...string) (*child, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NUDGE_") {
			env = append(env, kv)
		}
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(env, nudgeEnv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		c.waitErr = cmd.Wait()
		logf.Close()
		close(c.done)
	}()
	return c, nil
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// sample reads the process's peak RSS and CPU time while it runs (a reaped
// or exiting process has neither).
func (c *child) sample() {
	if c.exited() {
		return
	}
	pid := c.cmd.Process.Pid
	if v := vmHWM(fmt.Sprintf("/proc/%d/status", pid)); v > 0 {
		c.peakMiB = v
	}
	if v := cpuSeconds(pid); v > 0 {
		c.cpuSec = v
	}
}

// stop samples the process one last time, sends SIGTERM and waits for it
// (up to a minute, then SIGKILL).
func (c *child) stop() error {
	if c.exited() {
		return nil
	}
	c.sample()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return nil
	case <-time.After(time.Minute):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s ignored SIGTERM for a minute; killed", c.name)
	}
}

// failure describes an early exit, with the end of the process's log.
func (c *child) failure() error {
	b, _ := os.ReadFile(c.logPath)
	tail := string(b)
	if len(tail) > 2000 {
		tail = tail[len(tail)-2000:]
	}
	return fmt.Errorf("%s exited early (%v); its log ends:\n%s", c.name, c.waitErr, tail)
}

// procResult is one run of the real binaries.
type procResult struct {
	WorkerMiB, DispatcherMiB       float64  // VmHWM before SIGTERM
	WorkerCPU, DispatcherCPU       float64  // CPU seconds over the process's life
	Rate                           float64  // reminders/s, first claim → last terminal
	ProviderConns                  int64    // TCP connections the fake provider accepted (-1: unknown)
	WorkerErrors, DispatcherErrors []string // error-level lines each logged
}

// procRun seeds n due reminders, starts one sms-worker process (prefetch
// `prefetch`, otherwise its defaults) against an instant fake SMS provider
// (a process of its own, startFakeProvider), waits until it is ready, then starts one dispatcher process
// (batch `batch`, in its loop: the first pass takes the whole backlog, and
// a pass that fails is followed by another a second later, as in compose).
// The dispatcher is stopped once every reminder is enqueued, the worker once
// every one is terminal. With profile set, the worker writes its CPU profile
// there.
func procRun(ctx context.Context, e *env, bins *binaries, n, prefetch, batch int, profile string) (procResult, error) {
	var res procResult
	s, err := setupNudge(ctx, e, n, nil)
	if err != nil {
		return res, err
	}
	defer s.cleanup()
	sink, err := startFakeProvider()
	if err != nil {
		return res, err
	}
	defer func() {
		if sink != nil {
			sink.stop()
		}
	}()
	port, err := freePort()
	if err != nil {
		return res, err
	}
	common := []string{"--database-url", s.url, "--amqp-url", e.amqpURL, "--queue-prefix", s.topo.Prefix,
		"--log-format", "json", "--log-level", "warn"}
	keys := "NUDGE_SIGNING_KEYS=" + signingKeys

	args := append(common, "--prefetch", strconv.Itoa(prefetch), "--sms-url", sink.URL,
		"--listen", "127.0.0.1:"+strconv.Itoa(port))
	if profile != "" {
		if profile, err = filepath.Abs(profile); err != nil {
			return res, err
		}
		args = append(args, "--cpuprofile", profile)
	}
	started := time.Now()
	w, err := startChild("sms-worker", bins.worker, filepath.Join(bins.dir, "sms-worker.log"), args, keys)
	if err != nil {
		return res, err
	}
	defer func() { _ = w.stop() }()
	ready := "http://127.0.0.1:" + strconv.Itoa(port) + "/readyz"
	for deadline := time.Now().Add(30 * time.Second); ; {
		if w.exited() {
			return res, w.failure()
		}
		if r, err := http.Get(ready); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			return res, errors.New("sms-worker not ready after 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}

	d, err := startChild("dispatcher", bins.dispatcher, filepath.Join(bins.dir, "dispatcher.log"),
		append(common, "--batch", strconv.Itoa(batch), "--every", "1s", "--envelope-size", strconv.Itoa(envelopeSize),
			"--burst-envelope-size", strconv.Itoa(dispatchConfig(envelopeSize).BurstEnvelopeSize)), keys)
	if err != nil {
		return res, err
	}
	defer func() { _ = d.stop() }()

	timeout := time.After(10 * time.Minute)
	dispatched := false
	for {
		w.sample()
		d.sample()
		var past, terminal int
		if err := s.pool.QueryRow(ctx, stmt("StateCounts")).Scan(&past, &terminal); err != nil {
			return res, fmt.Errorf("polling progress: %w", err)
		}
		if !dispatched && past >= n {
			dispatched = true
			if err := d.stop(); err != nil {
				return res, err
			}
			res.DispatcherMiB, res.DispatcherCPU = d.peakMiB, d.cpuSec
		}
		if terminal >= n {
			break
		}
		if w.exited() {
			return res, w.failure()
		}
		if !dispatched && d.exited() {
			return res, d.failure()
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-timeout:
			return res, fmt.Errorf("only %d of %d reminders terminal after 10 minutes", terminal, n)
		case <-time.After(100 * time.Millisecond):
		}
	}
	e.measuredSince(started)
	if err := w.stop(); err != nil {
		return res, err
	}
	res.WorkerMiB, res.WorkerCPU = w.peakMiB, w.cpuSec
	res.ProviderConns = sink.stop()
	sink = nil
	var first, last time.Time
	if err := s.pool.QueryRow(ctx, stmt("E2ESpan"), belowWarm).Scan(&first, &last); err != nil {
		return res, fmt.Errorf("reading the run's span: %w", err)
	}
	res.Rate = float64(n) / last.Sub(first).Seconds()
	res.WorkerErrors, res.DispatcherErrors = w.errorLines(), d.errorLines()
	return res, nil
}

// errorLines returns the error-level lines of the process's JSON log.
func (c *child) errorLines() []string {
	b, _ := os.ReadFile(c.logPath)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, `"level":"error"`) || strings.Contains(l, `"level":"fatal"`) {
			out = append(out, l)
		}
	}
	return out
}

// freePort asks the kernel for a free TCP port on the loopback.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
