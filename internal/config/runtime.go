package config

import (
	"os"
	"runtime/debug"
)

// Worker binaries' collector defaults (GCDefaults): see docs/deploy.md,
// "Memory and the garbage collector".
const (
	// WorkerGCPercent is GOGC for a worker: the heap may grow to three times
	// what the last collection kept before the next one starts, instead of
	// twice (GOGC=100), so a worker collects half as often.
	WorkerGCPercent = 200
	// WorkerMemoryLimit is GOMEMLIMIT for a worker, in bytes: a soft limit
	// under which the collector runs as often as it must to stay, whatever
	// WorkerGCPercent allows, so the larger target cannot carry a worker past
	// its 64 MiB memory request.
	WorkerMemoryLimit = 48 << 20
)

// GCDefaults sets the collector's target (GOGC) to gcPercent and its soft
// memory limit (GOMEMLIMIT) to limit bytes, each unless the environment
// sets it: an operator's GOGC or GOMEMLIMIT wins.
func GCDefaults(gcPercent int, limit int64) {
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(gcPercent)
	}
	if _, ok := os.LookupEnv("GOMEMLIMIT"); !ok {
		debug.SetMemoryLimit(limit)
	}
}
