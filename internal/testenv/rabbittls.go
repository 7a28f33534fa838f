package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// TLSRabbitMQ is a RabbitMQ node of a test's own, beside the machine's
// broker: its own node name, ports, Erlang cookie (HOME), database and logs,
// listening only for AMQPS on a spare loopback port. It verifies a client
// certificate when one is presented (verify_peer) and offers the EXTERNAL
// mechanism (rabbitmq_auth_mechanism_ssl), which logs in as the
// certificate's common name.
type TLSRabbitMQ struct {
	Port int
	// User and Password are the node's only user (all permissions on "/").
	User, Password string
	dir            string
	cmd            *exec.Cmd
	out            *bytes.Buffer
	mu             sync.Mutex
	exited         chan struct{}
}

// RabbitMQServerBin is the broker's start script; the one in /usr/sbin
// switches to the rabbitmq user, which could not read the test's files.
const RabbitMQServerBin = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// ErrRabbitMQServerNotFound means RabbitMQServerBin is missing (install
// the rabbitmq-server package).
var ErrRabbitMQServerNotFound = errors.New("rabbitmq-server not found at " + RabbitMQServerBin)

// StartTLSRabbitMQ starts the node with the server certificate and caFile
// (the authority for client certificates), creating user with password
// (neither may contain a newline or start with '#'), and waits until it
// accepts connections.
func StartTLSRabbitMQ(ctx context.Context, certFile, keyFile, caFile, user, password string) (*TLSRabbitMQ, error) {
	if _, err := os.Stat(RabbitMQServerBin); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRabbitMQServerNotFound, err)
	}
	dir, err := os.MkdirTemp("", "nudge-rabbittls-")
	if err != nil {
		return nil, err
	}
	r := &TLSRabbitMQ{User: user, Password: password, dir: dir, out: &bytes.Buffer{}, exited: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			r.Stop()
		}
	}()
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	r.Port = ports[0]
	conf := strings.Join([]string{
		"listeners.tcp = none",
		"listeners.ssl.default = 127.0.0.1:" + strconv.Itoa(r.Port),
		"ssl_options.cacertfile = " + caFile,
		"ssl_options.certfile = " + certFile,
		"ssl_options.keyfile = " + keyFile,
		"ssl_options.verify = verify_peer",
		"ssl_options.fail_if_no_peer_cert = false",
		"auth_mechanisms.1 = PLAIN",
		"auth_mechanisms.2 = EXTERNAL",
		"ssl_cert_login_from = common_name",
		"default_user = " + user,
		"default_pass = " + password,
		"loopback_users = none",
		"log.console = true",
		"log.console.level = warning",
		"",
	}, "\n")
	for name, body := range map[string]string{"rabbitmq.conf": conf, "enabled_plugins": "[rabbitmq_auth_mechanism_ssl].\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	for _, sub := range []string{"home", "mnesia", "log", "plugins-expand"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, err
		}
	}
	r.cmd = exec.Command(RabbitMQServerBin)
	r.cmd.Dir = dir
	r.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + filepath.Join(dir, "home"), // its own Erlang cookie
		"RABBITMQ_NODENAME=nudge-tls-" + RandomID() + "@localhost",
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(ports[1]),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_PLUGINS_EXPAND_DIR=" + filepath.Join(dir, "plugins-expand"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "rabbit.pid"),
	}
	w := lockedWriter{mu: &r.mu, w: r.out}
	r.cmd.Stdout, r.cmd.Stderr = w, w
	// A process group of its own: Stop signals the script, the Erlang VM
	// and its helpers together.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", RabbitMQServerBin, err)
	}
	go func() { _ = r.cmd.Wait(); close(r.exited) }()
	// The AMQPS listener opens once the node has booted.
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port))
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			break
		}
		select {
		case <-r.exited:
			return nil, fmt.Errorf("the RabbitMQ node exited while starting:\n%s", r.Output())
		case <-ctx.Done():
			return nil, fmt.Errorf("the RabbitMQ node did not open %s: %w\n%s", addr, ctx.Err(), r.Output())
		case <-time.After(200 * time.Millisecond):
		}
	}
	ok = true
	return r, nil
}

// Output is what the node printed so far.
func (r *TLSRabbitMQ) Output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// Stop stops the node (SIGTERM, then SIGKILL after 20 seconds) and removes
// its directory.
func (r *TLSRabbitMQ) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		pgid := r.cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		// The script exits with the VM; anything of the group still alive
		// after 20 seconds is killed.
		deadline := time.Now().Add(20 * time.Second)
		for syscall.Kill(-pgid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-r.exited
		r.cmd = nil
	}
	if r.dir != "" {
		_ = os.RemoveAll(r.dir)
		r.dir = ""
	}
}
