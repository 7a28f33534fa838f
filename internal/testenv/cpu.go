package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcCPU is the CPU time of every thread of process pid (/proc/PID/stat,
// 10 ms ticks), for benchmarks that charge a server process (a PostgreSQL
// backend, the RabbitMQ node) with its share; 0 when unreadable.
func ProcCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ = 100
}

// BrokerPID is the pid of the RabbitMQ node on this host (its beam.smp), 0
// when none runs here. Its CPU covers every client of the node, not only
// the benchmark's.
func BrokerPID() int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if comm, err := os.ReadFile("/proc/" + e.Name() + "/comm"); err == nil && strings.TrimSpace(string(comm)) == "beam.smp" {
			return pid
		}
	}
	return 0
}
