package worker

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunnersRunEveryCallAtOnce: a batch's sends run concurrently, each
// exactly once, whether a runner is idle or a new one starts; calls that
// only finish once every one of them has started would deadlock otherwise.
func TestRunnersRunEveryCallAtOnce(t *testing.T) {
	t.Parallel()
	r := runners{work: make(chan task)}
	for round := range 3 { // the later rounds find the first round's runners idle
		const n = 50
		var started, ran sync.WaitGroup
		var calls atomic.Int64
		started.Add(n)
		ran.Add(n)
		ts := &tasks{run: func(int) {
			defer ran.Done()
			calls.Add(1)
			started.Done()
			started.Wait() // returns only once all n run at the same time
		}}
		for i := range n {
			r.run(task{ts, i})
		}
		ran.Wait()
		require.Equal(t, int64(n), calls.Load(), "round %d: every call ran once", round)
	}
}
