package config_test

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/config"
)

// TestGCDefaultsYieldToTheEnvironment: the workers' collector defaults apply
// only where the operator set neither GOGC nor GOMEMLIMIT. Not parallel: it
// changes the process's collector settings (and restores them).
func TestGCDefaultsYieldToTheEnvironment(t *testing.T) {
	percent, limit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })
	current := func() (int, int64) {
		p := debug.SetGCPercent(100)
		debug.SetGCPercent(p)
		return p, debug.SetMemoryLimit(-1)
	}

	t.Run("unset: the defaults", func(t *testing.T) {
		unsetenv(t, "GOGC", "GOMEMLIMIT")
		config.GCDefaults(config.WorkerGCPercent, config.WorkerMemoryLimit)
		p, l := current()
		require.Equal(t, config.WorkerGCPercent, p)
		require.Equal(t, int64(config.WorkerMemoryLimit), l)
	})
	t.Run("set: the operator's", func(t *testing.T) {
		debug.SetGCPercent(150)
		debug.SetMemoryLimit(math.MaxInt64)
		t.Setenv("GOGC", "150")
		t.Setenv("GOMEMLIMIT", "off")
		config.GCDefaults(config.WorkerGCPercent, config.WorkerMemoryLimit)
		p, l := current()
		require.Equal(t, 150, p, "GOGC from the environment")
		require.Equal(t, int64(math.MaxInt64), l, "GOMEMLIMIT from the environment")
	})
}

// nudge-bench runs its in-process workers at the worker binaries' GOGC and
// keeps its own copy of the figure (its module does not import this
// package): the two must agree, or the bench measures another collector.
func TestBenchHarnessUsesTheWorkersGCPercent(t *testing.T) {
	src, err := os.ReadFile("../../bench/cmd/nudge-bench/main.go")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("const workerGCPercent = %d\n", config.WorkerGCPercent)
	if !strings.Contains(string(src), want) {
		t.Fatalf("bench/cmd/nudge-bench/main.go lacks %q", want)
	}
}
