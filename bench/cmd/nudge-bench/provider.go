package main

// The fake SMS provider runs in a child process of its own (this binary,
// started again with -serve-fake-provider), so that its server-side CPU,
// which in production is the provider's machine's, is read from /proc apart
// from the harness's: the harness's "Go" figure is then the dispatcher, the
// workers and the client side of the HTTP call only. The wire stays real
// HTTP over loopback.
//
// The child serves fakesms.New() through fakesms.FastServer rather than
// net/http's server: the sends take its short path (same handler, same
// records, the answer written byte for byte as net/http writes it:
// TestFakeProviderWire), everything else goes to net/http's server. That
// roughly halved the fake's CPU per send (BenchmarkFakeProvider), which
// here competes with Nudge for the machine's two cores while in
// production it is another company's machine: a change to the harness,
// not to Nudge (docs/benchmarks.md, "The fake SMS provider's CPU").

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/nudgehq/nudge/internal/fakesms"
)

// fakeProviderProfile is the fake provider's -fake-provider-cpuprofile: the
// harness passes it to every fake provider process it starts, each of which
// overwrites the file with its own profile when it stops (so it holds the
// last one's). Registered here rather than in main so that the flag travels
// with the code that uses it.
var fakeProviderProfile = flag.String("fake-provider-cpuprofile", "", "CPU profile of the fake SMS provider's process, written when it stops (each fake provider started overwrites it: the file holds the last one's; empty: none)")

// fakeProviderPID is the pid of the running fake provider's process (0:
// none), which readCPU counts apart.
var fakeProviderPID atomic.Int64

// serveFakeProvider is the child's side: it serves the instant fake SMS
// provider on a loopback port, writes its URL as one line to stdout, and
// when stdin ends (the harness closed it, or exited) writes the number of
// TCP connections it accepted as a second line and returns.
func serveFakeProvider(stdin io.Reader, stdout io.Writer) error {
	if *fakeProviderProfile != "" {
		f, err := os.Create(*fakeProviderProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := fakesms.NewFastServer(fakesms.New())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	if _, err := fmt.Fprintf(stdout, "http://%s\n", ln.Addr()); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, stdin)
	_ = srv.Close()
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%d\n", srv.Accepted())
	return err
}

// fakeProvider is the fake provider's running process.
type fakeProvider struct {
	URL string
	cmd *exec.Cmd
	in  io.Closer
	out *bufio.Reader
}

// stop ends the process and returns the TCP connections it accepted
// (-1 if it did not say).
func (p *fakeProvider) stop() int64 {
	fakeProviderPID.CompareAndSwap(int64(p.cmd.Process.Pid), 0)
	_ = p.in.Close()
	line, _ := p.out.ReadString('\n')
	_ = p.cmd.Wait()
	n, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// startFakeProvider starts the fake provider's process; its CPU is read
// apart (readCPU) until it is stopped.
func startFakeProvider() (*fakeProvider, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("fake provider: %w", err)
	}
	args := []string{"-serve-fake-provider"}
	if *fakeProviderProfile != "" {
		args = append(args, "-fake-provider-cpuprofile", *fakeProviderProfile)
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("fake provider: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("fake provider: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fake provider: %w", err)
	}
	p := &fakeProvider{cmd: cmd, in: in, out: bufio.NewReader(out)}
	line, err := p.out.ReadString('\n')
	if err != nil {
		p.stop()
		return nil, fmt.Errorf("fake provider: reading its URL: %w", err)
	}
	p.URL = strings.TrimSpace(line)
	fakeProviderPID.Store(int64(cmd.Process.Pid))
	return p, nil
}
