package testenv

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
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

// CPUProfile starts a CPU profile into the file NUDGE_BENCH_CPUPROFILE names,
// if it names one, for a benchmark that profiles its measured window only
// (seeding excluded, unlike go test -cpuprofile); stop ends it, and may be
// called again (deferred as well) or when none was started.
func CPUProfile(tb testing.TB) (stop func()) {
	name := os.Getenv("NUDGE_BENCH_CPUPROFILE")
	if name == "" {
		return func() {}
	}
	f, err := os.Create(name)
	if err != nil {
		tb.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		tb.Fatal(err)
	}
	return sync.OnceFunc(func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			tb.Error(err)
		}
	})
}
