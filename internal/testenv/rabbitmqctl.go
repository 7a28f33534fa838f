package testenv

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// CloseConnections closes, through rabbitmqctl, every broker connection
// whose connection_name contains name, the way an operator's
// `rabbitmqctl close_all_connections` (or a broker restart) would, but only
// for this test's processes. It returns how many it closed.
func CloseConnections(tb testing.TB, name string) int {
	tb.Helper()
	needs(tb, "rabbitmqctl")
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		Unavailable(tb, "rabbitmqctl", "run the tests on the broker's machine as a user allowed to use rabbitmqctl", err)
		return 0
	}
	out, err := exec.Command("rabbitmqctl", "-q", "list_connections", "pid", "client_properties").Output()
	if err != nil {
		tb.Fatalf("rabbitmqctl list_connections: %v", err)
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		pid, props, ok := strings.Cut(sc.Text(), "\t")
		if !ok || !strings.Contains(props, `"connection_name","`) || !strings.Contains(props, name) {
			continue
		}
		if msg, err := exec.Command("rabbitmqctl", "close_connection", pid, "closed by test").CombinedOutput(); err != nil {
			tb.Logf("closing %s: %v %s", pid, err, msg)
			continue
		}
		n++
	}
	return n
}
