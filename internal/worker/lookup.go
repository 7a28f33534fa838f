package worker

import (
	"context"
	"errors"
	"time"

	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// This file settles unknown outcomes at the provider. An attempt whose
// outcome is unknown (the provider's answer never came, or its worker died
// mid-send) may have reached the recipient. A provider that deduplicates on
// the idempotency key makes a retry harmless, but Twilio does not, so before
// the next attempt of such a reminder sends, the worker asks the provider
// (provider.Looker) whether it holds the message, and records the reminder
// delivered instead of sending again when it does. The same question is
// asked where such a reminder would end expired (or failed for want of
// attempts): the record then matches what the recipient got. A sender that
// is not a Looker sends as before.

const (
	// codeFound is the metrics code of a reminder found at the provider.
	codeFound = "found_at_provider"
	// reasonFound is the event reason of a reminder found at the provider.
	reasonFound = "found at the provider: an earlier attempt whose outcome was unknown reached it; not sent again"
)

// onLookup decides from the provider's answer to a lookup of the earlier
// attempts whose outcome is unknown: found (delivered, without a send), not
// found (kindSend: sending is safe), the message found failed for good
// (kindFail: a carrier's refusal, say; sending again would not help), or no
// answer (kindProceed with the error: the caller must not send).
func onLookup(providerID string, err error) verdict {
	if err == nil {
		return verdict{kind: kindDelivered, transition: reminder.CodeFoundAtProvider, attempt: reminder.OutcomeDelivered,
			code: codeFound, reason: reasonFound + " (message " + providerID + ")"}
	}
	if errors.Is(err, provider.ErrNotFound) {
		return verdict{kind: kindSend}
	}
	pe := provider.Classify(err)
	if pe.Kind == provider.Permanent {
		return verdict{kind: kindFail, transition: reminder.CodePermanentFailure, attempt: reminder.OutcomeNotSent,
			code: pe.Code, err: pe.Error(), reason: "permanent failure at the provider of an earlier attempt: " + pe.Code}
	}
	return verdict{kind: kindProceed, code: "lookup_" + pe.Code, err: pe.Error()}
}

// onLookupFailed is the verdict on an attempt that could not ask the
// provider about an earlier unknown outcome: nothing is sent, and it is
// retried as a retryable failure would be.
func onLookupFailed(lv verdict, attempt int, now, deadline time.Time, p retryPolicy, jitter float64) verdict {
	v := onAnswer(provider.RetryableError(lv.code, 0, errors.New(lv.err)), attempt, now, deadline, p, jitter)
	v.attempt = reminder.OutcomeNotSent
	return v
}

// afterUnknown reports whether v (the verdict on a send) ends the reminder
// while the send's own outcome is unknown: then the provider is asked first.
func afterUnknown(v verdict) bool {
	return v.attempt == reminder.OutcomeUnknown && (v.kind == kindExpire || v.kind == kindFail)
}

// looker returns the sender as a Looker, if it is one.
func (w *Worker) looker() (provider.Looker, bool) {
	l, ok := w.sender.(provider.Looker)
	return l, ok
}

// readUnknown sets it.earlier for the claimed attempts that are not their
// reminder's first, from one statement. False means the attempts could not
// be read: the caller must not send them.
func (w *Worker) readUnknown(ctx context.Context, sending []*item) bool {
	if _, ok := w.looker(); !ok {
		return true
	}
	var ids, except []int64
	for _, it := range sending {
		if it.att.Number > 1 {
			ids = append(ids, it.row.ID)
			except = append(except, it.att.AttemptID)
		}
	}
	if len(ids) == 0 {
		return true
	}
	unknown, err := w.unknownAttempts(ctx, ids, except)
	if err != nil {
		return false
	}
	for _, it := range sending {
		it.earlier = store.Earlier(unknown[it.row.ID])
	}
	return true
}

// unknownAttempts reads the attempts of unknown outcome of the reminders
// ids (but not the attempts except), retrying a failing database.
func (w *Worker) unknownAttempts(ctx context.Context, ids, except []int64) (unknown map[int64][]store.UnknownAttempt, err error) {
	err = w.retryDB(ctx, "reading attempts of unknown outcome", func() (err error) {
		unknown, err = w.store.UnknownAttempts(ctx, ids, except)
		return err
	})
	return unknown, err
}

// lookup asks the provider about msg.Earlier, within one send timeout, and
// returns the verdict with the provider's id of what it found.
func (w *Worker) lookup(ctx context.Context, msg provider.Message) (verdict, string) {
	l, _ := w.looker()
	lctx, cancel := context.WithTimeout(ctx, w.cfg.SendTimeout)
	defer cancel()
	id, err := l.Lookup(lctx, msg)
	return onLookup(id, err), id
}

// beforeResend is the verdict on a claimed attempt whose reminder has
// earlier attempts of unknown outcome (with the provider's id of a message
// found): kindSend when the provider has none of their messages, else the
// verdict to record without sending.
func (w *Worker) beforeResend(ctx context.Context, it *item, msg provider.Message) (verdict, string) {
	if len(msg.Earlier) == 0 {
		return verdict{kind: kindSend}, ""
	}
	v, id := w.lookup(ctx, msg)
	if v.kind == kindProceed {
		return onLookupFailed(v, it.att.Number, w.clock.Now(), it.row.Deadline, w.policy(), w.rand()), ""
	}
	return v, id
}

// settleUnknown asks the provider about a send whose outcome is unknown and
// whose verdict v would end the reminder (expired at the deadline, failed
// for want of attempts): found, it is delivered; refused for good, failed;
// otherwise v stands.
func (w *Worker) settleUnknown(ctx context.Context, it *item, msg provider.Message, v verdict) (verdict, string) {
	if _, ok := w.looker(); !ok || !afterUnknown(v) {
		return v, ""
	}
	msg.Earlier = append(msg.Earlier, provider.Earlier{AttemptID: it.att.AttemptID, Started: it.claimedAt, Provider: it.provider})
	lv, id := w.lookup(ctx, msg)
	switch lv.kind {
	case kindDelivered:
		return lv, id
	case kindFail:
		lv.attempt = reminder.OutcomePermanent
		return lv, ""
	}
	return settleLater(v, w.clock.Now(), it.row.Deadline, w.topo.RetryTiers[0]), ""
}

// unsent decides an attempt that sends nothing (v: the deadline came
// within the margin, no capacity or send window is left). When v would end
// the reminder expired while an earlier attempt's outcome is unknown, the
// provider is asked first, as before a resend: found, the reminder is
// delivered; not found, v stands (the earlier attempt ended a retry tier
// ago or more: its request has long arrived or never will); no answer, it
// is left retrying at its deadline to be asked again (settleLater).
func (w *Worker) unsent(ctx context.Context, it *item, v verdict) {
	if _, ok := w.looker(); !ok || v.kind != kindExpire || len(it.earlier) == 0 {
		w.decided(it, v, "")
		return
	}
	lv, id := w.lookup(ctx, w.message(it, it.earlier))
	switch lv.kind {
	case kindDelivered:
		w.decided(it, lv, id)
	case kindProceed:
		w.decided(it, settleLater(v, w.clock.Now(), it.row.Deadline, w.topo.RetryTiers[0]), "")
	default:
		w.decided(it, v, "")
	}
}

// settleLater is the verdict on a send of unknown outcome that would expire
// its reminder (v) when the provider, asked at once, did not have its
// message or could not answer. "Not yet" proves nothing: the request that
// timed out may still be on its way in (a provider under load takes a
// request its client has given up on). So the reminder does not expire
// now: it is recorded retrying at its deadline (or a retry tier from now,
// if later), when nothing can be claimed for it any more (no attempt starts
// at or after the deadline), and the return of its retry message
// (foundBeforeExpiry) or the reconciler's pass (settling at the deadline)
// asks the provider again before it expires. Other verdicts stand.
func settleLater(v verdict, now, deadline time.Time, firstTier time.Duration) verdict {
	if v.kind != kindExpire {
		return v
	}
	at := now.Add(firstTier)
	if deadline.After(at) {
		at = deadline
	}
	return verdict{kind: kindRetry, transition: reminder.CodeRetry, attempt: v.attempt, at: at, code: v.code, err: v.err,
		reason: v.reason + "; the outcome is unknown: the provider is asked again after the deadline, before it expires"}
}

// foundBeforeExpiry asks the provider about the reminders whose deadline is
// reached while an earlier attempt's outcome is unknown, records those it
// holds as delivered (acked), and returns the others, still to expire. A
// reminder the provider could not answer about is acked and left as it is:
// nothing more can be sent past the deadline, and the reconciler asks the
// provider again before it expires it (reconcile: settling at the deadline).
func (w *Worker) foundBeforeExpiry(ctx context.Context, now time.Time, its []*item) []*item {
	if _, ok := w.looker(); !ok {
		return its
	}
	var ids []int64
	for _, it := range its {
		if it.row.Attempts > 0 {
			ids = append(ids, it.row.ID)
		}
	}
	if len(ids) == 0 {
		return its
	}
	unknown, err := w.unknownAttempts(ctx, ids, nil)
	if err != nil {
		return its
	}
	var rest, found []*item
	for _, it := range its {
		if as := unknown[it.row.ID]; len(as) > 0 {
			switch v, _ := w.lookup(ctx, w.message(it, store.Earlier(as))); v.kind {
			case kindDelivered:
				found = append(found, it)
				continue
			case kindProceed:
				w.with(w.log.Info(), it).Str("code", v.code).Msg("the provider could not be asked at the deadline; left to the reconciler")
				it.settled = toAck
				continue
			}
		}
		rest = append(rest, it)
	}
	if len(found) == 0 {
		return rest
	}
	if err := w.retryDB(ctx, "recording reminders found at the provider", func() error {
		moved, err := w.store.FoundAtProvider(ctx, now, fenced(found), w.cfg.Name, reasonFound)
		w.counts.delivered.Add(int64(len(moved)))
		w.m.Outcomes(string(w.cfg.Channel), string(reminder.Delivered), codeFound, len(moved))
		return err
	}); err == nil {
		for _, it := range found {
			it.settled = toAck // delivered now, or moved on by someone else
		}
	}
	return rest
}

// policy is the worker's retry policy.
func (w *Worker) policy() retryPolicy {
	return retryPolicy{maxAttempts: w.cfg.MaxAttempts, base: w.cfg.BackoffBase, max: w.cfg.BackoffMax, topo: w.topo}
}

// message is the provider message of it's reminder.
func (w *Worker) message(it *item, earlier []provider.Earlier) provider.Message {
	return provider.Message{
		ReminderID: it.row.ID, IdempotencyKey: it.row.IdempotencyKey, Tenant: it.row.Tenant,
		Recipient: it.row.Recipient, Template: it.row.Template, Data: it.row.Data, Deadline: it.row.Deadline,
		Earlier: earlier, Provider: it.provider,
	}
}

// providerName is the provider the sender's next send goes to, recorded on
// the attempts a claim makes: "" for a sender that does not say.
func (w *Worker) providerName() string {
	if c, ok := w.sender.(provider.Chooser); ok {
		return c.Current()
	}
	return ""
}

// route records that it's attempt goes to provider name, before its request
// leaves (provider.Message.Route): failover chose another provider than the
// one the claim recorded.
func (w *Worker) route(ctx context.Context, it *item) func(name string) error {
	return func(name string) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.SendTimeout)
		defer cancel()
		if err := w.store.AttemptProvider(ctx, it.att.AttemptID, name); err != nil {
			return err
		}
		it.provider = name
		return nil
	}
}
