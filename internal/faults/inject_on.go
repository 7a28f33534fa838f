//go:build faultinject

package faults

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

var (
	mu      sync.Mutex
	reached = map[string]int{}
)

// inject kills the process when NUDGE_FAULT is "point" or "point@N" (the
// Nth time the point is reached).
func inject(point string) {
	spec := os.Getenv("NUDGE_FAULT")
	name, nth, _ := strings.Cut(spec, "@")
	if name != point {
		return
	}
	want := 1
	if n, err := strconv.Atoi(nth); err == nil && n > 0 {
		want = n
	}
	mu.Lock()
	reached[point]++
	hit := reached[point] == want
	mu.Unlock()
	if !hit {
		return
	}
	fmt.Fprintf(os.Stderr, "FAULT INJECTED: killing process at %s\n", point)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never returns
}
