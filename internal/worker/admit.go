package worker

import (
	"context"
	"net/url"
	"strings"
	"time"

	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// admit reserves fleet-wide send slots for the messages about to be claimed,
// one round trip per tenant in the batch, and returns the messages granted a
// slot, each to be sent at its slot (at most ratelimit.Horizon ahead). What
// gets no slot is not waited for: it goes back through the retry tiers until
// its turn, or expires as rate_limited when its turn is at or past its
// deadline (allot decides which). A message that comes back a tier or more
// before its turn keeps waiting without asking.
func (w *Worker) admit(ctx context.Context, items []*item) []*item {
	if w.fleet == nil || len(items) == 0 {
		return items
	}
	ch := string(w.cfg.Channel)
	now := w.clock.Now()
	var keep, hops, waits, late []*item
	byFlow := map[ratelimit.Flow][]*item{}
	var order []ratelimit.Flow
	for _, it := range items {
		if beforeAsking(it.env.NotBefore, now, w.topo).kind == kindHop {
			hops = append(hops, it)
			continue
		}
		f := w.flow(it)
		if _, ok := byFlow[f]; !ok {
			order = append(order, f)
		}
		byFlow[f] = append(byFlow[f], it)
	}
	for _, flow := range order {
		its, tenant := byFlow[flow], flow.Tenant
		msgs := make([]waiting, len(its))
		fresh := 0
		for i, it := range its {
			msgs[i] = waiting{notBefore: it.env.NotBefore, deadline: it.row.Deadline}
			if it.env.NotBefore.IsZero() {
				fresh++
			}
		}
		served := serviceOrder(msgs)
		inOrder := make([]waiting, len(served))
		for k, i := range served {
			inOrder[k] = msgs[i]
		}
		g, err := w.fleet.Reserve(ctx, w.clock.Now(), flow, len(its), fresh)
		if err != nil {
			w.log.Warn().Err(err).Str("tenant", tenant).Msg("rate limiter unavailable; giving the messages back")
			continue // not kept, not settled: nacked and redelivered
		}
		for k, v := range allot(g, inOrder) {
			it := its[served[k]]
			switch v.kind {
			case kindSend:
				it.sendAt = v.at
				keep = append(keep, it)
			case kindExpireEarly:
				late = append(late, it)
			case kindWaitTurn:
				it.env.NotBefore = v.at
				waits = append(waits, it)
				w.m.RateLimitDeferral(ch, "fleet")
			}
		}
	}
	if len(late) > 0 {
		fs := fenced(late)
		if err := w.retryDB(ctx, "expiring rate-limited reminders", func() error {
			moved, err := w.store.ExpireEarly(ctx, now, fs, w.cfg.Name, reasonRateLimited)
			w.m.Outcomes(ch, string(reminder.Expired), codeRateLimited, len(moved))
			return err
		}); err == nil {
			for _, it := range late {
				it.settled = toAck
			}
		}
	}
	if len(waits) > 0 {
		untils := make([]time.Time, len(waits))
		for i, it := range waits {
			untils[i] = it.env.NotBefore
		}
		if err := w.retryDB(ctx, "deferring rate-limited reminders", func() error {
			_, err := w.store.Defer(ctx, now, fenced(waits), untils)
			return err
		}); err == nil {
			hops = append(hops, waits...)
		}
	}
	w.waitForTurns(ctx, now, hops)
	return members(items, keep, true)
}

// flow is the rate-limit flow of it's message: its tenant on the channel,
// and for a webhook its target host (limited per host, ChannelLimits.Hosts).
func (w *Worker) flow(it *item) ratelimit.Flow {
	f := ratelimit.Flow{Channel: string(w.cfg.Channel), Tenant: it.row.Tenant}
	if w.cfg.Channel == reminder.Webhook {
		if u, err := url.Parse(it.row.Recipient); err == nil {
			f.Host = strings.ToLower(u.Hostname())
		}
	}
	return f
}

// waitForTurns hands rate-limited messages back through the retry tiers
// towards their turns (env.NotBefore), in hops of the longest tier that does
// not overshoot, so each comes back at or just before its turn.
func (w *Worker) waitForTurns(ctx context.Context, now time.Time, its []*item) {
	byTier := map[time.Duration][]*item{}
	var tiers []time.Duration
	for _, it := range its {
		tier := max(w.topo.TierAtMost(it.env.NotBefore.Sub(now)), w.topo.RetryTiers[0])
		if _, ok := byTier[tier]; !ok {
			tiers = append(tiers, tier)
		}
		byTier[tier] = append(byTier[tier], it)
	}
	for _, tier := range tiers {
		w.deferMany(ctx, byTier[tier], tier)
	}
}
