package main

// The fake SMS provider runs in a child process of its own (this binary,
// started again with -serve-fake-provider), so that its server-side CPU,
// which in production is the provider's machine's, is read from /proc apart
// from the harness's: the harness's "Go" figure is then the dispatcher, the
// workers and the client side of the HTTP call only. The wire stays real
// HTTP over loopback.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nudgehq/nudge/internal/fakesms"
)

// fakeProviderPID is the pid of the running fake provider's process (0:
// none), which readCPU counts apart.
var fakeProviderPID atomic.Int64

// serveFakeProvider is the child's side: it serves the instant fake SMS
// provider on a loopback port, writes its URL as one line to stdout, and
// returns when stdin ends (the harness closed it, or exited).
func serveFakeProvider(stdin io.Reader, stdout io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: fakesms.New(), ReadHeaderTimeout: 10 * time.Second}
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
	return nil
}

// startFakeProvider starts the fake provider's process and returns its URL
// and a function that stops it and waits for it.
func startFakeProvider() (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, fmt.Errorf("fake provider: %w", err)
	}
	cmd := exec.Command(self, "-serve-fake-provider")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, fmt.Errorf("fake provider: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, fmt.Errorf("fake provider: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("fake provider: %w", err)
	}
	stop := func() {
		fakeProviderPID.Store(0)
		_ = in.Close()
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("fake provider: reading its URL: %w", err)
	}
	fakeProviderPID.Store(int64(cmd.Process.Pid))
	return strings.TrimSpace(line), stop, nil
}
