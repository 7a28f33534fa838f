package worker

import (
	"fmt"
	"sort"
	"time"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/provider"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// This file holds every decision the worker takes about a message, as pure
// functions of what it knows at that moment (the message, the row, the time,
// the limiter's grant, the provider's answer, a jitter draw) returning a
// verdict. They read no clock, touch no database or broker and keep no
// state; the effect steps (claim.go, admit.go, send.go, publish.go) carry
// the verdicts out, one batched statement or publish per kind. The table in
// decide_test.go covers every verdict.

// kind is what the worker does with a message.
type kind int

const (
	// kindProceed: nothing is decided yet; go on to the next step.
	kindProceed kind = iota
	// kindDeadLetter: publish the message to the dead-letter queue with its reason.
	kindDeadLetter
	// kindQuarantine: dead-letter the message and park its reminder
	// (before the send); or record the reminder quarantined (after it).
	kindQuarantine
	// kindDiscard: ack without a write; code says why (a metrics.Dup* kind).
	kindDiscard
	// kindDefer: not due yet; hand it back through the retry tier covering at (the due time).
	kindDefer
	// kindExpire: the deadline is reached (or would be before the next attempt).
	kindExpire
	// kindExpireEarly: no rate-limit turn before the deadline; expire it now.
	kindExpireEarly
	// kindHop: it already has a rate-limit turn (at) a retry tier or more
	// ahead; keep waiting without asking the limiter.
	kindHop
	// kindWaitTurn: no slot now; record the turn (at) and wait for it in the retry tiers.
	kindWaitTurn
	// kindClaim: claim the attempt.
	kindClaim
	// kindSend: send, at the slot at (zero: at once).
	kindSend
	// kindDelivered: the provider accepted the message.
	kindDelivered
	// kindRetry: try again at at, through the retry tiers.
	kindRetry
	// kindFail: a permanent failure, or the attempts are exhausted.
	kindFail
	// kindWaitWindow: its send window is closed; record the opening (at)
	// and wait for it in the retry tiers, as for a rate-limit turn.
	kindWaitWindow
	// kindExpireNoWindow: its send window does not open again before the
	// deadline; expire it now.
	kindExpireNoWindow
)

var kindNames = [...]string{
	kindProceed: "proceed", kindDeadLetter: "dead-letter", kindQuarantine: "quarantine", kindDiscard: "discard",
	kindDefer: "defer", kindExpire: "expire", kindExpireEarly: "expire-early", kindHop: "hop",
	kindWaitTurn: "wait-turn", kindClaim: "claim", kindSend: "send", kindDelivered: "delivered",
	kindRetry: "retry", kindFail: "fail", kindWaitWindow: "wait-window", kindExpireNoWindow: "expire-no-window",
}

func (k kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// verdict is one decision about one message.
type verdict struct {
	kind kind
	// reason is the sentence for the event trail or the dead letter.
	reason string
	// code is the short reason for metrics ("delivered", "http_503",
	// "deadline"); for kindDiscard, the metrics.Dup* kind.
	code string
	// at is the time the kind is about: the due time (kindDefer), the turn
	// (kindHop, kindWaitTurn), the slot (kindSend, zero: at once) or the
	// next attempt (kindRetry).
	at time.Time
	// transition is the code the attempt's outcome records, for the kinds
	// that end an attempt: the state it leads to comes from
	// reminder.Transitions.
	transition reminder.Code
	// attempt is how the attempt ended, for the kinds that end one.
	attempt reminder.Outcome
	// err is the provider's error, or why nothing was sent.
	err string
}

// String shows every field, for test failures and debug logs.
func (v verdict) String() string {
	s := v.kind.String()
	if !v.at.IsZero() {
		s += " at " + v.at.Format(time.RFC3339Nano)
	}
	return s + fmt.Sprintf(" reason=%q code=%q transition=%q attempt=%q err=%q", v.reason, v.code, v.transition, v.attempt, v.err)
}

// Reasons and codes shared by more than one verdict.
const (
	reasonDeadline    = "deadline reached before the send started"
	reasonRateLimited = "rate_limited: no capacity before the deadline"
	codeDeadline      = "deadline"
	// codeDeadlineMargin: expired before the send because the deadline was
	// within the deadline margin (the send would have been accepted late).
	codeDeadlineMargin = "deadline_margin"
	codeRateLimited    = "rate_limited"
	reasonNoWindow     = "no send window opens before the deadline"
	codeWindowClosed   = string(reminder.CodeWindowClosed)
	codeNoWindow       = string(reminder.CodeNoWindowBeforeDeadline)
	// Codes of the verdicts that dead-letter a message: the only values
	// of the dead-letter counter's reason label (never free text, which
	// would give the metric one series per message).
	codeUnverifiable    = "unverifiable"
	codeWrongChannel    = "wrong_channel"
	codePoison          = "poison"
	codeUnknownReminder = "unknown_reminder"
	codePanic           = "panic"
)

// onReceive decides about a delivery before its row is read: one that
// cannot be verified or is on the wrong queue is dead-lettered, one
// delivered poisonAfter times or more before is quarantined.
func onReceive(openErr error, env message.Envelope, channel reminder.Channel, deliveredBefore int64, poisonAfter int) verdict {
	switch {
	case openErr != nil:
		return verdict{kind: kindDeadLetter, code: codeUnverifiable, reason: "unverifiable: " + openErr.Error()}
	case env.Channel != string(channel):
		return verdict{kind: kindDeadLetter, code: codeWrongChannel,
			reason: fmt.Sprintf("wrong channel %q on the %s queue", env.Channel, channel)}
	case deliveredBefore >= int64(poisonAfter):
		return verdict{kind: kindQuarantine, code: codePoison,
			reason: fmt.Sprintf("delivered %d times without an outcome", deliveredBefore+1)}
	}
	return verdict{kind: kindProceed}
}

// onRow decides about a message from its reminder's row as read at now
// (found false: there is no such row) by the worker of channel: the row wins
// over the message. A row of another channel is not this worker's to touch,
// whatever the message says (it verified, so it was signed by a holder of
// this channel's key naming another channel's reminder: a bug or a
// compromised component): it is dead-lettered rather than discarded, so that
// an operator sees it, and the row is left as it is.
func onRow(row store.Delivery, found bool, fence int64, channel reminder.Channel, now time.Time) verdict {
	switch {
	case !found:
		return verdict{kind: kindDeadLetter, code: codeUnknownReminder, reason: "unknown reminder"}
	case row.Channel != channel:
		return verdict{kind: kindDeadLetter, code: codeWrongChannel,
			reason: fmt.Sprintf("reminder %d is of channel %q, not %s", row.ID, row.Channel, channel)}
	case row.State.Terminal() || row.Fence != fence:
		// A decision newer than this message was taken: a cancel or expiry
		// (superseded), or this message's own earlier delivery (a duplicate
		// consume, suppressed).
		if row.State == reminder.Canceled || row.State == reminder.Expired {
			return verdict{kind: kindDiscard, code: metrics.DupSuperseded}
		}
		return verdict{kind: kindDiscard, code: metrics.DupConsume}
	case !now.Before(row.Deadline):
		return verdict{kind: kindExpire, reason: reasonDeadline, code: codeDeadline}
	case row.DueAt.After(now):
		return verdict{kind: kindDefer, at: row.DueAt}
	case row.State == reminder.Retrying && row.NextAttemptAt.After(now):
		// Its back-off (or rate-limit turn) is not over: a replayed or
		// early copy of its message waits for it like a message not yet due.
		return verdict{kind: kindDefer, at: row.NextAttemptAt}
	}
	return verdict{kind: kindClaim}
}

// lostClaim is the verdict on a message whose claim found the row moved on:
// another delivery of the same message won it, or it was canceled or
// expired between the read and the claim.
func lostClaim() verdict { return verdict{kind: kindDiscard, code: metrics.DupClaim} }

// beforeAsking decides whether a rate-limited message waits on for its turn
// (notBefore) without asking the limiter: while a retry tier still fits
// before the turn, asking would only be refused.
func beforeAsking(notBefore, now time.Time, topo broker.Topology) verdict {
	if !notBefore.IsZero() && topo.TierAtMost(notBefore.Sub(now)) > 0 {
		return verdict{kind: kindHop, at: notBefore}
	}
	return verdict{kind: kindProceed}
}

// waiting is what allot needs of a message that asks for a send slot.
type waiting struct {
	// notBefore is its turn from an earlier refusal (zero: it is new).
	notBefore time.Time
	deadline  time.Time
}

// serviceOrder returns the indexes of msgs in the order the limiter serves
// them: messages that waited before first, earliest turn first, then the
// new ones in arrival order.
func serviceOrder(msgs []waiting) []int {
	idx := make([]int, len(msgs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		na, nb := msgs[idx[a]].notBefore, msgs[idx[b]].notBefore
		if na.IsZero() != nb.IsZero() {
			return !na.IsZero()
		}
		return na.Before(nb)
	})
	return idx
}

// allot decides, from the limiter's grant for one tenant, about each of its
// messages in service order: the first ones granted are sent at their slots;
// each of the others gets the turn it can expect (k intervals past the
// flow's next turn for the k-th that waited before, or past its queue for the
// k-th new one) and waits for it, or expires now when that turn is at or past
// its deadline.
func allot(g ratelimit.Grant, msgs []waiting) []verdict {
	out := make([]verdict, len(msgs))
	granted := g.Granted(len(msgs))
	var waited, queued int
	for k, m := range msgs {
		if k < granted {
			out[k] = verdict{kind: kindSend}
			if !g.Unlimited {
				out[k].at = g.Slots[k]
			}
			continue
		}
		var turn time.Time
		if m.notBefore.IsZero() {
			turn = g.QueueAt.Add(time.Duration(queued) * g.Spacing)
			queued++
		} else {
			turn = g.NextAt.Add(time.Duration(waited) * g.Spacing)
			waited++
		}
		if !turn.Before(m.deadline) {
			out[k] = verdict{kind: kindExpireEarly, reason: reasonRateLimited, code: codeRateLimited}
			continue
		}
		out[k] = verdict{kind: kindWaitTurn, at: turn}
	}
	return out
}

// onSlotMissed decides about a claimed attempt that got no send slot in
// time: nothing was sent, and the claim counted an attempt. It comes back
// after the first retry tier, or expires when that is at or past the deadline.
func onSlotMissed(now, deadline time.Time, firstTier time.Duration) verdict {
	v := verdict{attempt: reminder.OutcomeNotSent, err: "not sent: no rate-limit slot in time", code: "slot_missed"}
	next := now.Add(firstTier)
	if !next.Before(deadline) {
		v.kind, v.transition, v.reason = kindExpire, reminder.CodeNoCapacity, reasonRateLimited
		return v
	}
	v.kind, v.transition, v.at, v.reason = kindRetry, reminder.CodeRetry, next, "rate_limited: send slot missed; retrying"
	return v
}

// beforeSend decides, at the last moment before the provider call (after
// every wait, and again by the adapter's gate right before the request
// leaves), whether it may start: never at or after the deadline, nor when
// the deadline is within margin of now. A send takes the provider's latency
// to be accepted, so one started just before the deadline would be accepted
// after it; the margin is sized from that latency (Config.DeadlineMargin).
func beforeSend(now, deadline time.Time, margin time.Duration) verdict {
	v := verdict{kind: kindExpire, transition: reminder.CodeDeadlineBeforeSend, attempt: reminder.OutcomeNotSent, err: "not sent"}
	switch {
	case !now.Before(deadline):
		v.reason, v.code = reasonDeadline, codeDeadline
	case !now.Add(margin).Before(deadline):
		v.reason, v.code = fmt.Sprintf("deadline within the send margin (%s) before the send started", margin), codeDeadlineMargin
	default:
		return verdict{kind: kindSend}
	}
	return v
}

// windowBeforeClaim decides about a message whose row is otherwise
// claimable at now, from the send window that applies to it in the
// recipient's zone (loc; nil when this binary's zone database does not know
// it): claim it while the window is open; else wait for the next opening, or
// expire it now when no opening starts before the deadline. A limited window
// in an unknown zone cannot be judged: the message is quarantined for an
// operator rather than sent at an hour nobody can check.
func windowBeforeClaim(w localtime.Window, loc *time.Location, now, deadline time.Time) verdict {
	if w.IsAnyTime() {
		return verdict{kind: kindClaim}
	}
	if loc == nil {
		return verdict{kind: kindQuarantine, code: codePoison,
			reason: "quarantined: the recipient's time zone is unknown to this worker's zone database"}
	}
	switch d := localtime.Decide(w, loc, now, deadline, 0); {
	case d.Verdict == localtime.Send:
		return verdict{kind: kindClaim}
	case d.Verdict == localtime.Defer:
		return verdict{kind: kindWaitWindow, at: d.At, code: codeWindowClosed}
	case d.Reason == localtime.ReasonNoWindow:
		return verdict{kind: kindExpireNoWindow, reason: reasonNoWindow, code: codeNoWindow}
	}
	return verdict{kind: kindExpire, reason: reasonDeadline, code: codeDeadline}
}

// onWindow decides, at the moment the provider call would start (after any
// wait for a rate-limit slot, beside beforeSend), whether the send window
// still allows it: a retry or a slot wait can push a send past the window's
// close. The send must start at least margin (the deadline margin) before
// the window closes and before the deadline. Send; or retry at the next
// opening (nothing was sent); or expire when no opening starts before the
// deadline. A zone this binary does not
// know (loc nil) cannot be judged here: the claim (ClaimForDelivery, in SQL)
// found the window open.
func onWindow(w localtime.Window, loc *time.Location, now, deadline time.Time, margin time.Duration) verdict {
	if w.IsAnyTime() || loc == nil {
		return verdict{kind: kindSend}
	}
	d := localtime.Decide(w, loc, now, deadline, margin)
	v := verdict{attempt: reminder.OutcomeNotSent, err: "not sent: the send window is closed"}
	switch {
	case d.Verdict == localtime.Send:
		return verdict{kind: kindSend}
	case d.Verdict == localtime.Defer:
		v.kind, v.transition, v.at, v.code = kindRetry, reminder.CodeWindowClosed, d.At, codeWindowClosed
		v.reason = "send window closed; retrying at its next opening " + d.At.UTC().Format(time.RFC3339)
	case d.Reason == localtime.ReasonNoWindow:
		v.kind, v.transition, v.code, v.reason = kindExpire, reminder.CodeNoWindowBeforeDeadline, codeNoWindow, reasonNoWindow
	default:
		v.kind, v.transition, v.code, v.reason = kindExpire, reminder.CodeDeadlineBeforeSend, codeDeadline, reasonDeadline
	}
	return v
}

// retryPolicy is what decides a retry's delay.
type retryPolicy struct {
	maxAttempts int
	base, max   time.Duration
	topo        broker.Topology
}

// backoff is bounded exponential backoff with equal jitter (jitter in
// [0,1)), never shorter than the provider's Retry-After.
func (p retryPolicy) backoff(attempt int, retryAfter time.Duration, jitter float64) time.Duration {
	d := p.base << min(attempt-1, 30)
	if d <= 0 || d > p.max {
		d = p.max
	}
	d = d/2 + time.Duration(jitter*float64(d/2))
	return max(d, retryAfter)
}

// onAnswer decides what the provider's answer to attempt number attempt
// means at now: delivered; a permanent failure; attempts exhausted; a retry
// at the retry tier covering the backoff; or expired when that retry would
// come at or after the deadline.
func onAnswer(sendErr error, attempt int, now, deadline time.Time, p retryPolicy, jitter float64) verdict {
	if sendErr == nil {
		return verdict{kind: kindDelivered, transition: reminder.CodeDelivered, attempt: reminder.OutcomeDelivered,
			reason: "delivered", code: "delivered"}
	}
	pe := provider.Classify(sendErr)
	v := verdict{code: pe.Code, err: pe.Error(), attempt: pe.Outcome()}
	if pe.Kind == provider.Permanent {
		v.kind, v.transition, v.reason = kindFail, reminder.CodePermanentFailure, "permanent failure: "+pe.Code
		return v
	}
	if attempt >= p.maxAttempts {
		v.kind, v.transition = kindFail, reminder.CodeAttemptsExhausted
		v.reason = fmt.Sprintf("attempts exhausted (%d): %s", attempt, pe.Code)
		return v
	}
	// The retry tier covering the backoff; a Retry-After longer than the
	// longest tier is kept whole (the message comes back early and waits
	// out the rest in further hops: onRow defers it until next).
	want := p.backoff(attempt, pe.RetryAfter, jitter)
	delay := max(p.topo.Tier(want), want)
	next := now.Add(delay)
	if !next.Before(deadline) {
		v.kind, v.transition = kindExpire, reminder.CodeDeadlineBeforeRetry
		v.reason = "deadline would pass before the next attempt: " + pe.Code
		return v
	}
	v.kind, v.transition, v.at = kindRetry, reminder.CodeRetry, next
	v.reason = fmt.Sprintf("retry %d in %s: %s", attempt, delay, pe.Code)
	return v
}

// onPanic is the verdict on a send that panicked (a bug in the adapter or a
// template met this reminder): park it for an operator.
func onPanic(p any) verdict {
	return verdict{kind: kindQuarantine, transition: reminder.CodeSendPanicked, attempt: reminder.OutcomePanicked, code: codePanic,
		err: fmt.Sprintf("panic: %v", p), reason: "quarantined: the send panicked: " + fmt.Sprint(p)}
}
