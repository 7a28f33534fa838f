package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/nudgehq/nudge/internal/message"
)

// The envelope limit: the most reminders the dispatcher puts in one
// envelope. This release's workers accept message.MaxBatchEntries (200), the
// previous release's message.PreviousMaxBatchEntries (100) and dead-letter
// a larger envelope whole. The database says which holds
// (store.EnvelopeLimit: 100 until the after-rollout migration 49, run once
// no worker of the previous release is left, then 200, or what an operator
// set before rolling workers back), and a run caps EnvelopeSize and
// BurstEnvelopeSize at it. The dispatcher reads it at its first run and then
// at most once every envelopeLimitEvery on its clock, so a changed limit
// holds within a minute and a loop's passes (one every MinGap in a stream)
// cost no extra statement.

// envelopeLimitEvery is the most time between two reads of the limit.
const envelopeLimitEvery = time.Minute

// envelopeLimit is a dispatcher's last read of the limit.
type envelopeLimit struct {
	mu sync.Mutex
	// value is the limit read last (0: none read yet).
	value int
	// readAt is when it was read, on the dispatcher's clock.
	readAt time.Time
}

// envelopeLimitDue reports whether a run at now reads the limit again: when
// none was read yet (readAt zero), envelopeLimitEvery or more after the last
// read, or when the clock went back before it.
func envelopeLimitDue(now, readAt time.Time) bool {
	return readAt.IsZero() || now.Sub(readAt) >= envelopeLimitEvery || now.Before(readAt)
}

// capEnvelopes returns cfg (with its defaults) with EnvelopeSize and
// BurstEnvelopeSize at most limit, itself bounded to 1 to
// message.MaxBatchEntries (zero or less, none known:
// message.PreviousMaxBatchEntries).
func capEnvelopes(cfg Config, limit int) Config {
	if limit <= 0 {
		limit = message.PreviousMaxBatchEntries
	}
	limit = min(limit, message.MaxBatchEntries)
	cfg.EnvelopeSize = min(cfg.EnvelopeSize, limit)
	cfg.BurstEnvelopeSize = min(cfg.BurstEnvelopeSize, limit)
	return cfg
}

// envelopeCap is the limit a run at now uses: the last one read, read again
// when envelopeLimitDue. A failed read keeps the last value (the previous
// release's limit when there is none) and is tried again at the next run:
// the database is then down and the run's claim fails too.
func (d *Dispatcher) envelopeCap(ctx context.Context, now time.Time) int {
	l := &d.limit
	l.mu.Lock()
	defer l.mu.Unlock()
	if envelopeLimitDue(now, l.readAt) {
		n, err := d.Store.EnvelopeLimit(ctx)
		if err != nil {
			d.Log.Warn().Err(err).Int("envelope_limit", max(l.value, message.PreviousMaxBatchEntries)).
				Msg("reading the envelope limit: keeping the last one")
			if l.value == 0 {
				return message.PreviousMaxBatchEntries
			}
			return l.value
		}
		if n != l.value {
			d.Log.Info().Int("envelope_limit", n).Msg("envelope limit")
		}
		l.value, l.readAt = n, now
	}
	return l.value
}
