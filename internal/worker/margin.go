package worker

import (
	"sync"
	"time"
)

// The deadline margin: a send is not started when its deadline is within
// the margin of now, because a provider accepts a request some time after
// it leaves (its latency), and a send started just before the deadline would
// be accepted after it. The provider call is also cut at the deadline, but a
// provider may still accept a request whose client went away; the margin is
// what keeps accepts before the deadline. The window check (a send window's
// close) uses the same margin, for the same reason.
//
// Config.DeadlineMargin sets it; zero means automatic: twice the p99 of the
// provider-call latencies this worker measured over its last latencyWindow
// calls, at least minAutoMargin, at most Config.SendTimeout (a call takes no
// longer: a send started SendTimeout before the deadline is answered or cut
// before it). Until the first call is measured it is initialMargin (at most
// SendTimeout).
const (
	// latencyWindow is how many of the latest provider-call latencies the
	// automatic margin's p99 is taken over.
	latencyWindow = 1000
	// latencyRefresh: the p99 is recomputed every latencyRefresh calls (and
	// after each of the first latencyRefresh), not on every send.
	latencyRefresh = 16
	// minAutoMargin is the least automatic margin: time for the scheduler
	// and the garbage collector between the check and the request leaving.
	minAutoMargin = 100 * time.Millisecond
	// initialMargin is the automatic margin before any call was measured.
	initialMargin = time.Second
	// autoMarginFactor multiplies the p99: headroom for the tail beyond it
	// and for the latency rising before the window notices.
	autoMarginFactor = 2
)

// deadlineMargin is the margin inside which a send is not started:
// configured when positive, else automatic from p99 (the measured p99 of
// provider-call latencies, over measured calls), bounded by sendTimeout.
func deadlineMargin(configured, p99 time.Duration, measured int, sendTimeout time.Duration) time.Duration {
	switch {
	case configured > 0:
		return configured
	case measured == 0:
		return min(initialMargin, sendTimeout)
	}
	return min(max(autoMarginFactor*p99, minAutoMargin), sendTimeout)
}

// latencies keeps the latest provider-call latencies of a worker and their
// p99. It is safe for concurrent use.
type latencies struct {
	mu   sync.Mutex
	ring []time.Duration // the latest, at most latencyWindow
	next int             // where the next one goes once ring is full
	n    int             // calls recorded in all
	p99  time.Duration   // as of the last refresh
}

// record adds the latency of one provider call.
func (l *latencies) record(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ring) < latencyWindow {
		l.ring = append(l.ring, d)
	} else {
		l.ring[l.next] = d
		l.next = (l.next + 1) % latencyWindow
	}
	l.n++
	if l.n <= latencyRefresh || l.n%latencyRefresh == 0 {
		l.p99 = p99(l.ring)
	}
}

// get returns the p99 and how many calls were measured.
func (l *latencies) get() (time.Duration, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p99, l.n
}

// p99 is the nearest-rank 99th percentile of ds: the largest of fewer than
// 100. It does not sort: the p99 of n is the k-th largest, k = n − ⌈0.99 n⌉
// + 1 (at most 11 for the window of 1,000), so one pass keeping the k
// largest seen finds it, where sorting the window cost the real worker ~4%
// of its CPU (a sort every latencyRefresh sends; ds is left as it is).
func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	rank := (99*len(ds) + 99) / 100 // ceil(0.99 n), 1-based
	k := len(ds) - rank + 1
	var buf [16]time.Duration
	top := buf[:0] // the k largest seen, ascending
	for _, d := range ds {
		if len(top) == k {
			if d <= top[0] {
				continue
			}
			// The smallest leaves: shift the smaller ones down, d in place.
			i := 1
			for ; i < k && top[i] < d; i++ {
				top[i-1] = top[i]
			}
			top[i-1] = d
			continue
		}
		top = append(top, d)
		for i := len(top) - 1; i > 0 && top[i-1] > top[i]; i-- {
			top[i-1], top[i] = top[i], top[i-1]
		}
	}
	return top[0]
}

// deadlineMargin is the worker's margin now (Config.DeadlineMargin, or the
// automatic one): the send check and the window check take it.
func (w *Worker) deadlineMargin() time.Duration {
	p, n := w.latency.get()
	return deadlineMargin(w.cfg.DeadlineMargin, p, n, w.cfg.SendTimeout)
}
