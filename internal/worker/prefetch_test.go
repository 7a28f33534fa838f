package worker

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/message"
)

// The consumer's window, in messages, as deliveries of a given size come:
// the defaults (Prefetch 400 reminders, Concurrency 4, Batch 50).
func TestPrefetchWindow(t *testing.T) {
	t.Parallel()
	// feed observes sizes and returns every new window asked for.
	feed := func(p *prefetch, sizes ...int) (windows []int) {
		for _, n := range sizes {
			if w := p.observe(n); w != 0 {
				require.Equal(t, w, p.window)
				windows = append(windows, w)
			}
		}
		return windows
	}
	repeat := func(n, size int) []int {
		s := make([]int, n)
		for i := range s {
			s[i] = size
		}
		return s
	}

	t.Run("a backlog of envelopes of 50 is taken 16 at a time", func(t *testing.T) {
		p := newPrefetch(400, 4, 50)
		require.Equal(t, 16, p.window, "4 × Concurrency, above 400 / 50")
		require.Empty(t, feed(p, repeat(1000, 50)...), "no new consumer")
	})
	t.Run("envelopes of 200 (schema 49) stay at 16 messages, the worst case held", func(t *testing.T) {
		p := newPrefetch(400, 4, 50)
		require.Empty(t, feed(p, repeat(1000, message.MaxBatchEntries)...), "no new consumer")
		require.Equal(t, 16, p.window, "the floor: 4 × Concurrency")
		// The most a worker holds at the defaults: 3,200 reminders, bodies of
		// at most 768 KiB; its sends stay bounded by sendSlots.
		require.Equal(t, 3200, p.window*message.MaxBatchEntries)
		require.LessOrEqual(t, p.window*message.MaxBatchBodyBytes, 768<<10)
	})
	t.Run("single messages widen it to Prefetch messages in a few steps", func(t *testing.T) {
		p := newPrefetch(400, 4, 50)
		got := feed(p, repeat(200, 1)...)
		require.Equal(t, 400, got[len(got)-1])
		require.LessOrEqual(t, len(got), 5)
		for i := 1; i < len(got); i++ {
			require.GreaterOrEqual(t, got[i], 2*got[i-1], "each step at least doubles: %v", got)
		}
		require.Empty(t, feed(p, repeat(1000, 1)...))
	})
	t.Run("envelopes after single messages narrow it at the first", func(t *testing.T) {
		p := newPrefetch(400, 4, 50)
		feed(p, repeat(200, 1)...)
		require.Equal(t, []int{16}, feed(p, 50))
		feed(p, repeat(20, 50)...)
		require.Equal(t, 16, p.window)
	})
	t.Run("a few single messages among envelopes keep it", func(t *testing.T) {
		p := newPrefetch(400, 4, 50)
		var mix []int
		for range 100 {
			mix = append(mix, 50, 1, 1, 1)
		}
		require.Empty(t, feed(p, mix...))
	})
	t.Run("never below 4 × Concurrency, never above Prefetch", func(t *testing.T) {
		p := newPrefetch(400, 4, 50)
		feed(p, repeat(50, 100)...)
		require.Equal(t, 16, p.window, "envelopes of 100")
		wide := newPrefetch(2000, 4, 50)
		require.Equal(t, 40, wide.window, "2,000 reminders in envelopes of 50")
		small := newPrefetch(3, 4, 50)
		require.Equal(t, 3, small.window)
		feed(small, repeat(100, 1)...)
		require.Equal(t, 3, small.window)
	})
}
