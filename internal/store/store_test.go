package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

var t0 = time.Date(2026, 8, 12, 9, 0, 0, 0, time.UTC)

type bundle struct {
	db    *testenv.DB
	st    *store.Store
	clock *clock.Fake
}

func setup(t *testing.T) bundle {
	t.Helper()
	db := testenv.Postgres(t)
	return bundle{db: db, st: store.New(db.Pool), clock: clock.NewFake(t0)}
}

// setupBeforeRollout is setup on the schema as the previous release's
// binaries run on it (schema.Migrate, the after-rollout migrations not
// applied): for the tests that run the previous release's statements.
func setupBeforeRollout(t *testing.T) bundle {
	t.Helper()
	db := testenv.PostgresBeforeRollout(t)
	return bundle{db: db, st: store.New(db.Pool), clock: clock.NewFake(t0)}
}

// schedule records a reminder due at due with the given deadline.
func (b bundle) schedule(t *testing.T, key string, due, deadline time.Time) int64 {
	t.Helper()
	res, err := intake.Schedule(context.Background(), b.db.Pool, intake.Request{
		Tenant: "acme", Key: key, Channel: reminder.Email, Recipient: "a@example.com",
		Template: "course-expiry", DueAt: due, Deadline: deadline,
	})
	require.NoError(t, err)
	return res.ID
}

func (b bundle) get(t *testing.T, id int64) reminder.Reminder {
	t.Helper()
	r, err := intake.Get(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	return r
}

func (b bundle) lastEvent(t *testing.T, id int64) reminder.Event {
	t.Helper()
	evs, err := intake.Events(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	return evs[len(evs)-1]
}

func TestClaimDueRespectsCutoffDeadlineAndLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()

	due := b.schedule(t, "due", now.Add(-time.Minute), now.Add(time.Hour))
	later := b.schedule(t, "later", now.Add(time.Second), now.Add(time.Hour))
	late := b.schedule(t, "late", now.Add(-2*time.Hour), now.Add(-time.Hour))

	got, err := b.st.ClaimDue(ctx, now, now, 10, time.Minute, "dispatcher-1")
	require.NoError(t, err)
	require.Len(t, got, 2, "the row due after the cutoff is not claimed")

	r := b.get(t, due)
	require.Equal(t, reminder.Enqueued, r.State)
	require.Equal(t, int64(1), r.Fence)
	require.Equal(t, now.Add(time.Minute), r.LeaseUntil.UTC())
	require.Equal(t, "claimed for dispatch", b.lastEvent(t, due).Reason)

	r = b.get(t, late)
	require.Equal(t, reminder.Expired, r.State, "a row past its deadline is expired, never enqueued")
	require.Equal(t, "deadline passed before dispatch", r.Reason)
	require.Equal(t, reminder.Pending, b.get(t, later).State)

	// Limit: only one of two due rows per claim.
	b.schedule(t, "d2", now.Add(-time.Second), now.Add(time.Hour))
	b.schedule(t, "d3", now.Add(-time.Second), now.Add(time.Hour))
	got, err = b.st.ClaimDue(ctx, now, now, 1, time.Minute, "dispatcher-1")
	require.NoError(t, err)
	require.Len(t, got, 1)
}

// A tenant's backlog does not go ahead of other tenants' reminders due at
// the same time: each batch takes an even part from every tenant with due
// rows, each in due order, and says whether rows may be left.
func TestClaimDueIsRoundRobinAcrossTenants(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	var reqs []intake.Request
	add := func(tenant string, n int) {
		for i := range n {
			reqs = append(reqs, intake.Request{Tenant: tenant, Key: fmt.Sprint("k", i), Channel: reminder.SMS,
				Recipient: "+14155550100", Template: "course-expiry",
				DueAt: now.Add(-time.Hour).Add(time.Duration(i) * time.Second), Deadline: now.Add(time.Hour)})
		}
	}
	add("big", 300) // scheduled first, due first
	add("small", 7)
	add("mid", 40)
	_, err := intake.ScheduleMany(ctx, b.db.Pool, reqs)
	require.NoError(t, err)

	per := func(cs []store.Claimed) map[string]int {
		m := map[string]int{}
		for _, c := range cs {
			m[c.Tenant]++
		}
		return m
	}
	got, more, err := b.st.ClaimDueBatch(ctx, now, now, 30, time.Minute, "d")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"big": 10, "small": 7, "mid": 10}, per(got),
		"ten each, short of 30 because small ran out")
	require.True(t, more, "a short batch with rows left says so")
	first := map[string]time.Time{}
	for _, c := range got {
		if f, ok := first[c.Tenant]; !ok || c.DueAt.Before(f) {
			first[c.Tenant] = c.DueAt
		}
	}
	require.Equal(t, now.Add(-time.Hour), first["big"].UTC(), "each tenant's part in due order")

	got, more, err = b.st.ClaimDueBatch(ctx, now, now, 30, time.Minute, "d")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"big": 15, "mid": 15}, per(got), "small is done: the others split the batch")
	require.True(t, more)

	total := 27 + 30
	for more {
		got, more, err = b.st.ClaimDueBatch(ctx, now, now, 100, time.Minute, "d")
		require.NoError(t, err)
		total += len(got)
	}
	require.Equal(t, 347, total, "every due row claimed once")
	got, more, err = b.st.ClaimDueBatch(ctx, now, now, 100, time.Minute, "d")
	require.NoError(t, err)
	require.Empty(t, got)
	require.False(t, more)
}

func TestTwoClaimersNeverShareARow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	for i := range 200 {
		b.schedule(t, fmt.Sprint("k", i), now.Add(-time.Minute), now.Add(time.Hour))
	}
	results := make(chan []store.Claimed, 4)
	for w := range 4 {
		go func() {
			var all []store.Claimed
			for {
				got, err := b.st.ClaimDue(ctx, now, now, 7, time.Minute, fmt.Sprint("d", w))
				if err != nil || len(got) == 0 {
					results <- all
					return
				}
				all = append(all, got...)
			}
		}()
	}
	seen := map[int64]bool{}
	for range 4 {
		for _, c := range <-results {
			require.False(t, seen[c.ID], "reminder %d claimed twice", c.ID)
			seen[c.ID] = true
		}
	}
	require.Len(t, seen, 200)
}

func TestDispatchLeaseResolvedByPublishConfirmation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	confirmedID := b.schedule(t, "confirmed", now.Add(-2*time.Minute), now.Add(time.Hour))
	lostID := b.schedule(t, "lost", now.Add(-time.Minute), now.Add(time.Hour))

	// Two claims, two batches: the broker confirms the first one's message;
	// the second one's dispatcher dies before recording anything.
	first, err := b.st.ClaimDue(ctx, now, now, 1, time.Minute, "d1")
	require.NoError(t, err)
	second, err := b.st.ClaimDue(ctx, now, now, 1, time.Minute, "d2")
	require.NoError(t, err)
	require.Len(t, first, 1)
	require.Len(t, second, 1)
	require.Equal(t, confirmedID, first[0].ID)
	require.Equal(t, lostID, second[0].ID)
	require.NotZero(t, first[0].Batch)
	require.NotEqual(t, first[0].Batch, second[0].Batch, "each claim is a batch of its own")
	for _, id := range []int64{confirmedID, lostID} {
		r := b.get(t, id)
		require.Equal(t, reminder.Enqueued, r.State, "a claim enqueues")
		require.NotNil(t, r.LeaseUntil, "under a dispatch lease")
	}
	require.NoError(t, b.st.ConfirmPublished(ctx, now, map[int64]int{first[0].Batch: 1}, "d1"))

	// While the leases run, nothing is resolved.
	released, cleared, err := b.st.ResolveExpiredLeases(ctx, now.Add(59*time.Second), 100, "reconciler")
	require.NoError(t, err)
	require.Equal(t, [2]int{0, 0}, [2]int{released, cleared})

	b.clock.Advance(2 * time.Minute)
	released, cleared, err = b.st.ResolveExpiredLeases(ctx, b.clock.Now(), 100, "reconciler")
	require.NoError(t, err)
	require.Equal(t, [2]int{1, 1}, [2]int{released, cleared}, "(released, cleared)")

	kept := b.get(t, confirmedID)
	require.Equal(t, reminder.Enqueued, kept.State, "confirmed: it waits in the queue")
	require.Equal(t, first[0].Fence, kept.Fence, "under the fence its message carries")
	require.Nil(t, kept.LeaseUntil)
	lost := b.get(t, lostID)
	require.Equal(t, reminder.Pending, lost.State, "unconfirmed: claimed and published again")
	require.Equal(t, second[0].Fence+1, lost.Fence, "a message that did reach the queue is now stale")
	evs, err := intake.Events(ctx, b.db.Pool, lostID)
	require.NoError(t, err)
	require.Len(t, evs, 3, "scheduled, claimed, released")
	require.Equal(t, [2]reminder.State{reminder.Pending, reminder.Enqueued}, [2]reminder.State{evs[1].From, evs[1].To})
	require.Equal(t, [2]reminder.State{reminder.Enqueued, reminder.Pending}, [2]reminder.State{evs[2].From, evs[2].To})
	require.Equal(t, "dispatch lease expired before the publish was confirmed", evs[2].Reason)

	// The dispatcher whose lease expired can no longer release the row.
	moved, err := b.st.Release(ctx, b.clock.Now(), []store.Fenced{{ID: lostID, Fence: second[0].Fence}}, "d2", "late")
	require.NoError(t, err)
	require.Empty(t, moved)

	// A second pass finds nothing more to resolve.
	released, cleared, err = b.st.ResolveExpiredLeases(ctx, b.clock.Now(), 100, "reconciler")
	require.NoError(t, err)
	require.Equal(t, [2]int{0, 0}, [2]int{released, cleared})
}

// During a rollout, dispatchers of schema version 6 and earlier still claim
// into leased (and move leased → enqueued row by row): the reconciler of
// this version returns such a row to pending when its lease runs out, and a
// worker of this version accepts its message.
func TestLeasedRowsOfAnEarlierVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	orphan := b.schedule(t, "orphan", now.Add(-time.Minute), now.Add(time.Hour))
	inFlight := b.schedule(t, "in-flight", now.Add(-time.Minute), now.Add(time.Hour))
	// What a version-6 ClaimDue leaves behind.
	_, err := b.db.Pool.Exec(ctx, `UPDATE reminder_state s SET state = 'leased', fence = 1,
		lease_until = CASE r.key WHEN 'orphan' THEN $1::timestamptz ELSE $2::timestamptz END
		FROM reminders r WHERE r.id = s.id`,
		now.Add(-time.Second), now.Add(time.Minute))
	require.NoError(t, err)

	released, cleared, err := b.st.ResolveExpiredLeases(ctx, now, 100, "reconciler")
	require.NoError(t, err)
	require.Equal(t, [2]int{1, 0}, [2]int{released, cleared})
	r := b.get(t, orphan)
	require.Equal(t, reminder.Pending, r.State)
	require.Equal(t, int64(2), r.Fence)
	require.Equal(t, "dispatch lease expired", b.lastEvent(t, orphan).Reason)

	got, err := b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: inFlight, Fence: 1}}, time.Minute, "w")
	require.NoError(t, err)
	require.Contains(t, got, inFlight)
	require.Equal(t, reminder.Sending, b.get(t, inFlight).State)
	require.Equal(t, reminder.Leased, b.lastEvent(t, inFlight).From)
}

// enqueue takes every due pending reminder to enqueued, with its publish
// confirmed, and returns the fence of id.
func (b bundle) enqueue(t *testing.T, id int64) int64 {
	t.Helper()
	ctx := context.Background()
	now := b.clock.Now()
	got, err := b.st.ClaimDue(ctx, now, now, 1000, time.Minute, "d")
	require.NoError(t, err)
	batches := map[int64]int{}
	for _, c := range got {
		batches[c.Batch]++
	}
	require.NoError(t, b.st.ConfirmPublished(ctx, now, batches, "d"))
	r := b.get(t, id)
	require.Equal(t, reminder.Enqueued, r.State)
	return r.Fence
}

func TestAttemptLifecycleAndRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	id := b.schedule(t, "k", now.Add(-time.Minute), now.Add(time.Hour))
	msgFence := b.enqueue(t, id)

	// A message with an older fence (superseded) cannot claim.
	got, err := b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: id, Fence: msgFence - 1}}, time.Minute, "w1")
	require.NoError(t, err)
	require.Empty(t, got)

	got, err = b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: id, Fence: msgFence}}, time.Minute, "w1")
	require.NoError(t, err)
	att := got[id]
	require.Equal(t, 1, att.Number)
	require.Equal(t, msgFence+1, att.Fence)
	require.Equal(t, reminder.Sending, b.get(t, id).State)

	// The same message delivered twice: the second claim finds nothing.
	again, err := b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: id, Fence: msgFence}}, time.Minute, "w2")
	require.NoError(t, err)
	require.Empty(t, again, "duplicate delivery must not claim a second attempt")

	// Retryable failure → retrying, fence kept for the retry message.
	next := now.Add(5 * time.Second)
	moved, err := b.st.RecordOutcomes(ctx, now, []store.Outcome{{ReminderID: id, Fence: att.Fence, AttemptID: att.AttemptID,
		Code: reminder.CodeRetry, Attempt: reminder.OutcomeRetryable, NextAttemptAt: &next, Error: "http_503"}}, "w1")
	require.NoError(t, err)
	require.True(t, moved[id])
	r := b.get(t, id)
	require.Equal(t, reminder.Retrying, r.State)
	require.Equal(t, next, r.NextAttemptAt.UTC())
	require.Equal(t, "http_503", r.LastError)

	// Issue 13, finding 8: a copy of the retry message replayed before the
	// next attempt time claims nothing, whatever the worker decides.
	b.clock.Advance(5*time.Second - time.Millisecond)
	rows, early, err := b.st.ClaimForDelivery(ctx, b.clock.Now(), reminder.Email, "", []store.Fenced{{ID: id, Fence: att.Fence}}, time.Minute, "stale")
	require.NoError(t, err)
	require.Empty(t, early, "no attempt before next_attempt_at")
	require.Equal(t, reminder.Retrying, rows[id].State)
	require.Equal(t, next, rows[id].NextAttemptAt.UTC(), "the row says until when")

	// Second attempt from the retry message, delivered.
	b.clock.Advance(time.Millisecond)
	got, err = b.st.ClaimAttempts(ctx, b.clock.Now(), []store.Fenced{{ID: id, Fence: att.Fence}}, time.Minute, "w2")
	require.NoError(t, err)
	att2 := got[id]
	require.Equal(t, 2, att2.Number)
	moved, err = b.st.RecordOutcomes(ctx, b.clock.Now(), []store.Outcome{{ReminderID: id, Fence: att2.Fence,
		AttemptID: att2.AttemptID, Code: reminder.CodeDelivered, Attempt: reminder.OutcomeDelivered, ProviderID: "p-1"}}, "w2")
	require.NoError(t, err)
	require.True(t, moved[id])
	r = b.get(t, id)
	require.Equal(t, reminder.Delivered, r.State)
	require.NotNil(t, r.FinishedAt)

	// Terminal: nothing moves it any more.
	moved, err = b.st.RecordOutcomes(ctx, b.clock.Now(), []store.Outcome{{ReminderID: id, Fence: att2.Fence,
		AttemptID: att2.AttemptID, Code: reminder.CodePermanentFailure, Attempt: reminder.OutcomePermanent}}, "w2")
	require.NoError(t, err)
	require.Empty(t, moved)
	b.clock.Advance(2 * time.Hour)
	n, err := b.st.ExpireOverdue(ctx, b.clock.Now(), 100, "reconciler")
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, reminder.Delivered, b.get(t, id).State)

	var attempts int
	require.NoError(t, b.db.Pool.QueryRow(ctx,
		`SELECT count(*) FROM delivery_attempts WHERE reminder_id = $1 AND outcome IS NOT NULL`, id).Scan(&attempts))
	require.Equal(t, 2, attempts)
}

func TestClaimAttemptRefusedAtOrAfterDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	id := b.schedule(t, "k", now.Add(-time.Minute), now.Add(time.Minute))
	fence := b.enqueue(t, id)

	b.clock.Advance(time.Minute) // exactly the deadline: too late
	got, err := b.st.ClaimAttempts(ctx, b.clock.Now(), []store.Fenced{{ID: id, Fence: fence}}, time.Minute, "w")
	require.NoError(t, err)
	require.Empty(t, got)

	moved, err := b.st.ExpireFenced(ctx, b.clock.Now(), []store.Fenced{{ID: id, Fence: fence}}, "w", "deadline reached while queued")
	require.NoError(t, err)
	require.True(t, moved[id])
	r := b.get(t, id)
	require.Equal(t, reminder.Expired, r.State)
	require.Equal(t, "deadline reached while queued", r.Reason)
}

func TestStaleSenderCannotRecordAfterTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	id := b.schedule(t, "k", now.Add(-time.Minute), now.Add(time.Hour))
	fence := b.enqueue(t, id)
	got, err := b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: id, Fence: fence}}, 30*time.Second, "slow-worker")
	require.NoError(t, err)
	slow := got[id]

	// The send lease expires; the reconciler takes the reminder over.
	b.clock.Advance(time.Minute)
	re, err := b.st.Reclaim(ctx, b.clock.Now(), 30*time.Second, 100, time.Minute, "reconciler")
	require.NoError(t, err)
	require.Len(t, re, 1)
	require.Greater(t, re[0].Fence, slow.Fence)
	require.Equal(t, "send lease expired; retrying with the same idempotency key", b.lastEvent(t, id).Reason)

	// The slow worker finally answers: its write is refused by the fence,
	// but its attempt row still records what the provider said.
	moved, err := b.st.RecordOutcomes(ctx, b.clock.Now(), []store.Outcome{{ReminderID: id, Fence: slow.Fence,
		AttemptID: slow.AttemptID, Code: reminder.CodeDelivered, Attempt: reminder.OutcomeDelivered, ProviderID: "p-9"}}, "slow-worker")
	require.NoError(t, err)
	require.Empty(t, moved)
	require.Equal(t, reminder.Enqueued, b.get(t, id).State)
	var outcome, errText string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT outcome, error FROM delivery_attempts WHERE id = $1`,
		slow.AttemptID).Scan(&outcome, &errText))
	require.Equal(t, "delivered", outcome)
	require.Contains(t, errText, "taken over")
}

func TestReclaimOverdueMessagesAndExpireOverdue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	lost := b.schedule(t, "lost", now.Add(-time.Minute), now.Add(time.Hour))
	soon := b.schedule(t, "soon", now.Add(-time.Minute), now.Add(3*time.Minute))
	b.enqueue(t, lost)
	b.enqueue(t, soon)

	b.clock.Advance(2 * time.Minute)
	re, err := b.st.Reclaim(ctx, b.clock.Now(), 5*time.Minute, 100, time.Minute, "reconciler")
	require.NoError(t, err)
	require.Empty(t, re, "not overdue yet")

	b.clock.Advance(4 * time.Minute) // lost is overdue; soon is past its deadline
	re, err = b.st.Reclaim(ctx, b.clock.Now(), 5*time.Minute, 100, time.Minute, "reconciler")
	require.NoError(t, err)
	require.Len(t, re, 1)
	require.Equal(t, lost, re[0].ID)

	n, err := b.st.ExpireOverdue(ctx, b.clock.Now(), 100, "reconciler")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	r := b.get(t, soon)
	require.Equal(t, reminder.Expired, r.State)
	require.Equal(t, "deadline passed while enqueued", r.Reason)
}

func TestExpireOverdueSparesLiveSend(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	id := b.schedule(t, "k", now.Add(-time.Minute), now.Add(time.Second))
	fence := b.enqueue(t, id)
	_, err := b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: id, Fence: fence}}, time.Minute, "w")
	require.NoError(t, err)

	b.clock.Advance(2 * time.Second) // past the deadline, send lease still live
	n, err := b.st.ExpireOverdue(ctx, b.clock.Now(), 100, "reconciler")
	require.NoError(t, err)
	require.Zero(t, n, "a send in flight under a live lease records its own outcome")

	b.clock.Advance(time.Minute) // the lease expired: the worker died
	n, err = b.st.ExpireOverdue(ctx, b.clock.Now(), 100, "reconciler")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "deadline passed; last send attempt outcome unknown", b.get(t, id).Reason)
}

// ExpireOverdue finds the rows not being sent by deadline and the sending
// ones among the send leases that ran out (schema version 31: no deadline
// index holds sending rows); a batch still takes the oldest deadlines across
// both.
func TestExpireOverdueTakesTheOldestDeadlinesAcrossSendingAndWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	sending := b.schedule(t, "sending", now.Add(-time.Minute), now.Add(20*time.Second))
	enqueued := b.schedule(t, "enqueued", now.Add(-time.Minute), now.Add(30*time.Second))
	fence := b.enqueue(t, sending)
	_, err := b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: sending, Fence: fence}}, 30*time.Second, "w")
	require.NoError(t, err)
	pending := b.schedule(t, "pending", now.Add(5*time.Second), now.Add(10*time.Second))

	b.clock.Advance(2 * time.Minute) // every deadline passed, the send lease ran out
	n, err := b.st.ExpireOverdue(ctx, b.clock.Now(), 2, "reconciler")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	require.Equal(t, reminder.Expired, b.get(t, pending).State)
	require.Equal(t, reminder.Expired, b.get(t, sending).State)
	require.Equal(t, reminder.Enqueued, b.get(t, enqueued).State, "the newest deadline waits for the next batch")
	n, err = b.st.ExpireOverdue(ctx, b.clock.Now(), 2, "reconciler")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, reminder.Expired, b.get(t, enqueued).State)
}

func TestCanceledWhileQueuedCannotBeClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	id := b.schedule(t, "k", now.Add(-time.Minute), now.Add(time.Hour))
	fence := b.enqueue(t, id)
	st, err := intake.Cancel(ctx, b.db.Pool, "acme", "k", "test", "learner unsubscribed")
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, st)

	got, err := b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: id, Fence: fence}}, time.Minute, "w")
	require.NoError(t, err)
	require.Empty(t, got)
	require.Equal(t, reminder.Canceled, b.get(t, id).State)
}

// TestEveryTransition walks each edge of the state machine once, with the
// guard that must refuse it when the fence is stale.
func TestEveryTransition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type step func(b bundle, id int64) (moved bool)
	claimDue := func(b bundle, id int64) bool {
		got, err := b.st.ClaimDue(ctx, b.clock.Now(), b.clock.Now(), 10, time.Minute, "d")
		require.NoError(t, err)
		return len(got) == 1 && got[0].ID == id
	}
	fence := func(b bundle, id int64) int64 { return b.get(t, id).Fence }
	claimAttempt := func(b bundle, id int64) (store.Attempt, bool) {
		got, err := b.st.ClaimAttempts(ctx, b.clock.Now(), []store.Fenced{{ID: id, Fence: fence(b, id)}}, time.Minute, "w")
		require.NoError(t, err)
		a, ok := got[id]
		return a, ok
	}
	outcome := func(code reminder.Code, kind reminder.Outcome) step {
		return func(b bundle, id int64) bool {
			a, ok := claimAttempt(b, id)
			require.True(t, ok)
			var next *time.Time
			if code == reminder.CodeRetry {
				n := b.clock.Now().Add(time.Second)
				next = &n
			}
			moved, err := b.st.RecordOutcomes(ctx, b.clock.Now(), []store.Outcome{{ReminderID: id, Fence: a.Fence,
				AttemptID: a.AttemptID, Code: code, Attempt: kind, NextAttemptAt: next, Reason: string(code)}}, "w")
			require.NoError(t, err)
			return moved[id]
		}
	}
	enqueue := func(b bundle, id int64) bool {
		b.enqueue(t, id)
		return true
	}
	cases := []struct {
		name  string
		setup []step
		final step
		want  reminder.State
	}{
		{"enqueued→sending (message before the publish confirmation)", []step{claimDue},
			func(b bundle, id int64) bool { _, ok := claimAttempt(b, id); return ok }, reminder.Sending},
		{"sending→failed", []step{enqueue}, outcome(reminder.CodePermanentFailure, reminder.OutcomePermanent), reminder.Failed},
		{"sending→expired (no time for another attempt)", []step{enqueue}, outcome(reminder.CodeDeadlineBeforeRetry, reminder.OutcomeRetryable), reminder.Expired},
		{"retrying→enqueued (retry message overdue)", []step{enqueue, outcome(reminder.CodeRetry, reminder.OutcomeRetryable)},
			func(b bundle, id int64) bool {
				b.clock.Advance(10 * time.Minute)
				got, err := b.st.Reclaim(ctx, b.clock.Now(), time.Minute, 10, time.Minute, "r")
				require.NoError(t, err)
				return len(got) == 1
			}, reminder.Enqueued},
		{"enqueued→pending (publish not confirmed)", []step{claimDue},
			func(b bundle, id int64) bool {
				moved, err := b.st.Release(ctx, b.clock.Now(), []store.Fenced{{ID: id, Fence: fence(b, id)}}, "d", "nack")
				require.NoError(t, err)
				return moved[id]
			}, reminder.Pending},
		{"retrying→expired (deadline while in a tier)", []step{enqueue, outcome(reminder.CodeRetry, reminder.OutcomeRetryable)},
			func(b bundle, id int64) bool {
				b.clock.Advance(2 * time.Hour)
				moved, err := b.st.ExpireFenced(ctx, b.clock.Now(), []store.Fenced{{ID: id, Fence: fence(b, id)}}, "w", "late")
				require.NoError(t, err)
				return moved[id]
			}, reminder.Expired},
		{"retrying→canceled", []step{enqueue, outcome(reminder.CodeRetry, reminder.OutcomeRetryable)},
			func(b bundle, id int64) bool {
				st, err := intake.Cancel(ctx, b.db.Pool, "acme", "k", "app", "unsubscribed")
				require.NoError(t, err)
				return st == reminder.Canceled
			}, reminder.Canceled},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			id := b.schedule(t, "k", b.clock.Now().Add(-time.Minute), b.clock.Now().Add(time.Hour))
			for _, s := range tc.setup {
				require.True(t, s(b, id))
			}
			before := b.get(t, id)
			require.True(t, tc.final(b, id))
			after := b.get(t, id)
			require.Equal(t, tc.want, after.State)
			require.Equal(t, tc.want, b.lastEvent(t, id).To, "the transition left its event")
			require.GreaterOrEqual(t, after.Fence, before.Fence)
		})
	}
}

func TestCancelRefusedWhileSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.schedule(t, "k", b.clock.Now().Add(-time.Minute), b.clock.Now().Add(time.Hour))
	f := b.enqueue(t, id)
	_, err := b.st.ClaimAttempts(ctx, b.clock.Now(), []store.Fenced{{ID: id, Fence: f}}, time.Minute, "w")
	require.NoError(t, err)
	st, err := intake.Cancel(ctx, b.db.Pool, "acme", "k", "app", "too late")
	require.NoError(t, err)
	require.Equal(t, reminder.Sending, st, "a send in flight cannot be recalled; its outcome will be recorded")
	require.Equal(t, reminder.Sending, b.get(t, id).State)
}

func TestRepublishedTooOftenIsQuarantinedThenExpires(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.schedule(t, "k", b.clock.Now().Add(-time.Minute), b.clock.Now().Add(time.Hour))
	b.enqueue(t, id)
	for i := range store.MaxRepublishes {
		b.clock.Advance(2 * time.Minute)
		got, err := b.st.Reclaim(ctx, b.clock.Now(), time.Minute, 10, time.Minute, "r")
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, reminder.Enqueued, got[0].State, "republish %d", i+1)
		require.NoError(t, b.st.ConfirmPublished(ctx, b.clock.Now(), map[int64]int{got[0].Batch: 1}, "r"))
	}
	b.clock.Advance(2 * time.Minute)
	got, err := b.st.Reclaim(ctx, b.clock.Now(), time.Minute, 10, time.Minute, "r")
	require.NoError(t, err)
	require.Equal(t, reminder.Quarantined, got[0].State)
	r := b.get(t, id)
	require.Equal(t, reminder.Quarantined, r.State)
	require.Equal(t, "republished 3 times without an outcome", r.Reason)

	// Quarantined is parked, not forgotten: the deadline still ends it.
	b.clock.Advance(time.Hour)
	n, err := b.st.ExpireOverdue(ctx, b.clock.Now(), 10, "r")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "deadline passed while quarantined", b.get(t, id).Reason)
}

// A reminder that ends undelivered after an attempt whose outcome nobody
// learned (its worker died mid-send) says so: the provider may have sent it.
func TestUndeliveredAfterAnUnknownOutcomeSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	id := b.schedule(t, "k", now.Add(-time.Minute), now.Add(2*time.Minute))
	f := b.enqueue(t, id)
	_, err := b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: id, Fence: f}}, 30*time.Second, "dying-worker")
	require.NoError(t, err)
	b.clock.Advance(time.Minute) // the send lease expires; the reconciler republishes
	re, err := b.st.Reclaim(ctx, b.clock.Now(), time.Hour, 10, time.Minute, "r")
	require.NoError(t, err)
	require.Len(t, re, 1)
	b.clock.Advance(2 * time.Minute) // the deadline passes before anyone sends again
	n, err := b.st.ExpireOverdue(ctx, b.clock.Now(), 10, "r")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "deadline passed while enqueued; an earlier attempt's outcome is unknown", b.get(t, id).Reason)
}

// Each deferred row's overdue clock restarts at its own turn, whatever order
// the rows are given in; a row whose fence moved on is left alone.
func TestDeferRestartsEachRowsClockAtItsTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	ids := make([]int64, 3)
	for i := range ids {
		ids[i] = b.schedule(t, fmt.Sprint("k", i), now.Add(-time.Minute), now.Add(time.Hour))
	}
	fences := map[int64]int64{}
	for _, id := range ids {
		fences[id] = b.enqueue(t, id)
	}
	// Given in reverse id order, each with its own turn; the last at a stale fence.
	fs := []store.Fenced{{ID: ids[2], Fence: fences[ids[2]]}, {ID: ids[1], Fence: fences[ids[1]]}, {ID: ids[0], Fence: 0}}
	untils := []time.Time{now.Add(30 * time.Second), now.Add(10 * time.Minute), now.Add(time.Hour)}
	moved, err := b.st.Defer(ctx, now, fs, untils)
	require.NoError(t, err)
	require.Equal(t, map[int64]bool{ids[2]: true, ids[1]: true}, moved)
	require.Equal(t, now.Add(30*time.Second), b.get(t, ids[2]).EnqueuedAt.UTC())
	require.Equal(t, now.Add(10*time.Minute), b.get(t, ids[1]).EnqueuedAt.UTC())
	require.NotEqual(t, now.Add(time.Hour), b.get(t, ids[0]).EnqueuedAt.UTC(), "stale fence: untouched")

	_, err = b.st.Defer(ctx, now, fs, untils[:2])
	require.ErrorContains(t, err, "2 untils for 3 reminders")
}

// A deferred message proves its publish: Defer clears the dispatch lease, so
// a batch whose confirmation was never recorded is not returned to pending
// (and published again under a new fence) while its message waits its turn.
func TestDeferClearsTheDispatchLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	id := b.schedule(t, "k", now.Add(-time.Minute), now.Add(time.Hour))
	claimed, err := b.st.ClaimDue(ctx, now, now, 10, time.Minute, "d") // no confirmation recorded
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	moved, err := b.st.Defer(ctx, now, []store.Fenced{{ID: id, Fence: claimed[0].Fence}}, []time.Time{now.Add(5 * time.Minute)})
	require.NoError(t, err)
	require.True(t, moved[id])
	require.Nil(t, b.get(t, id).LeaseUntil)

	released, cleared, err := b.st.ResolveExpiredLeases(ctx, now.Add(2*time.Minute), 100, "reconciler")
	require.NoError(t, err)
	require.Equal(t, [2]int{0, 0}, [2]int{released, cleared})
	r := b.get(t, id)
	require.Equal(t, reminder.Enqueued, r.State)
	require.Equal(t, claimed[0].Fence, r.Fence, "the deferred message stays current")
}

// One statement claims what ClaimAttempts would and returns every named row
// as it was before the claim, so the worker can tell why one was not claimed.
func TestClaimForDeliveryClaimsAndExplains(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	ok := b.schedule(t, "ok", now.Add(-time.Minute), now.Add(time.Hour))
	stale := b.schedule(t, "stale", now.Add(-time.Minute), now.Add(time.Hour))
	late := b.schedule(t, "late", now.Add(-time.Minute), now.Add(time.Second))
	okFence := b.enqueue(t, ok)
	staleFence := b.enqueue(t, stale)
	lateFence := b.enqueue(t, late)
	b.clock.Advance(2 * time.Second) // late's deadline passes
	now = b.clock.Now()

	rows, claimed, err := b.st.ClaimForDelivery(ctx, now, reminder.Email, "", []store.Fenced{
		{ID: ok, Fence: okFence}, {ID: stale, Fence: staleFence - 1}, {ID: late, Fence: lateFence}, {ID: 999999, Fence: 1},
	}, time.Minute, "w")
	require.NoError(t, err)
	require.Len(t, rows, 3, "the unknown id is absent")
	require.Equal(t, reminder.Enqueued, rows[ok].State, "rows as they were before the claim")
	require.Equal(t, okFence, rows[ok].Fence)
	require.Len(t, claimed, 1)
	att := claimed[ok]
	require.Equal(t, okFence+1, att.Fence)
	require.Equal(t, 1, att.Number)
	require.Positive(t, att.AttemptID)
	require.Equal(t, reminder.Sending, b.get(t, ok).State)
	require.Equal(t, reminder.Enqueued, b.get(t, stale).State, "a stale fence claims nothing")
	require.Equal(t, reminder.Enqueued, b.get(t, late).State, "past its deadline: not claimed")
	require.False(t, now.Before(rows[late].Deadline), "the row says why")
}

// A batch whose rows share a send window in different zones: each row is
// claimed only if its own zone's window is open at the claim, whatever its
// batch-mates' zones (the statement evaluates a window once per window and
// zone of the batch), and a row not otherwise claimable is returned unclaimed.
func TestClaimForDeliveryJudgesEachRowsWindowInItsZone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	zones := map[string]string{"utc1": "UTC", "utc2": "UTC", "tokyo1": "Asia/Tokyo", "tokyo2": "Asia/Tokyo",
		"stale": "UTC", "any": ""}
	ids, fences := map[string]int64{}, map[string]int64{}
	for key := range zones {
		ids[key] = b.schedule(t, key, now.Add(-time.Minute), now.Add(time.Hour))
		fences[key] = b.enqueue(t, ids[key])
	}
	// An hour ago to two hours ahead, in UTC hours: open in UTC, closed in
	// Tokyo (UTC+9, no daylight saving time).
	h := now.UTC().Hour()
	for key, tz := range zones {
		if tz == "" {
			continue
		}
		_, err := b.db.Pool.Exec(ctx, `UPDATE reminder_state SET tz = $2, window_open = make_time($3, 0, 0),
			window_close = make_time($4, 0, 0) WHERE id = $1`, ids[key], tz, (h+23)%24, (h+2)%24)
		require.NoError(t, err)
	}
	var fs []store.Fenced
	for key, id := range ids {
		f := fences[key]
		if key == "stale" {
			f--
		}
		fs = append(fs, store.Fenced{ID: id, Fence: f})
	}
	rows, claimed, err := b.st.ClaimForDelivery(ctx, now, reminder.Email, "", fs, time.Minute, "w")
	require.NoError(t, err)
	require.Len(t, rows, len(zones), "every named row is returned")
	var got []string
	for key, id := range ids {
		if _, ok := claimed[id]; ok {
			got = append(got, key)
			require.Equal(t, reminder.Sending, b.get(t, id).State)
		} else {
			require.Equal(t, reminder.Enqueued, b.get(t, id).State, key)
		}
	}
	require.ElementsMatch(t, []string{"utc1", "utc2", "any"}, got)
}

// Whether an attempt may have reached the recipient is the worker's typed
// outcome (delivery_attempts.result), not its error text; the text is read
// only for attempts of a worker before schema version 9, which has none.
func TestUnknownOutcomeIsTheAttemptsResult(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		name    string
		first   reminder.Outcome
		error   string
		legacy  bool // the first attempt as a version-8 worker recorded it
		unknown bool
	}{
		{"unknown, whatever the text", reminder.OutcomeUnknown, "connection reset", false, true},
		{"retryable, though the text says timeout", reminder.OutcomeRetryable, "retryable send failure (timeout): x", false, false},
		{"not sent", reminder.OutcomeNotSent, "not sent", false, false},
		{"version 8: timeout in the text", "", "retryable send failure (timeout): x", true, true},
		{"version 8: 503 in the text", "", "retryable send failure (http_503): x", true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			now := b.clock.Now()
			id := b.schedule(t, "k", now.Add(-time.Minute), now.Add(time.Hour))
			f := b.enqueue(t, id)
			att, err := b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: id, Fence: f}}, time.Minute, "w")
			require.NoError(t, err)
			next := now.Add(time.Second)
			first := tc.first
			if tc.legacy {
				first = reminder.OutcomeRetryable
			}
			_, err = b.st.RecordOutcomes(ctx, now, []store.Outcome{{ReminderID: id, Fence: att[id].Fence,
				AttemptID: att[id].AttemptID, Code: reminder.CodeRetry, Attempt: first, NextAttemptAt: &next, Error: tc.error}}, "w")
			require.NoError(t, err)
			if tc.legacy {
				_, err := b.db.Pool.Exec(ctx, `UPDATE delivery_attempts SET result = NULL WHERE id = $1`, att[id].AttemptID)
				require.NoError(t, err)
			}
			// The retry is claimed at its next attempt time, not before.
			again, err := b.st.ClaimAttempts(ctx, next, []store.Fenced{{ID: id, Fence: att[id].Fence}}, time.Minute, "w")
			require.NoError(t, err)
			moved, err := b.st.RecordOutcomes(ctx, next, []store.Outcome{{ReminderID: id, Fence: again[id].Fence,
				AttemptID: again[id].AttemptID, Code: reminder.CodeAttemptsExhausted, Attempt: reminder.OutcomeRetryable,
				Reason: "attempts exhausted (2): http_503"}}, "w")
			require.NoError(t, err)
			require.True(t, moved[id])
			r := b.get(t, id)
			require.Equal(t, reminder.Failed, r.State)
			want := "attempts exhausted (2): http_503"
			if tc.unknown {
				want += "; an earlier attempt's outcome is unknown"
			}
			require.Equal(t, want, r.Reason)
			ev := b.lastEvent(t, id)
			require.Equal(t, reminder.CodeAttemptsExhausted, ev.Code)
		})
	}
}

// RecordOutcomes takes the next state from the transition table: a code that
// leads nowhere from sending is refused, and nothing is written.
func TestRecordOutcomesRefusesACodeTheTableDoesNotAllow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := b.clock.Now()
	id := b.schedule(t, "k", now.Add(-time.Minute), now.Add(time.Hour))
	f := b.enqueue(t, id)
	att, err := b.st.ClaimAttempts(ctx, now, []store.Fenced{{ID: id, Fence: f}}, time.Minute, "w")
	require.NoError(t, err)
	for _, o := range []store.Outcome{
		{Code: reminder.CodeClaimed, Attempt: reminder.OutcomeDelivered},
		{Code: reminder.CodeDelivered, Attempt: "sent-ish"},
	} {
		o.ReminderID, o.Fence, o.AttemptID = id, att[id].Fence, att[id].AttemptID
		_, err := b.st.RecordOutcomes(ctx, now, []store.Outcome{o}, "w")
		require.Error(t, err, "%+v", o)
	}
	require.Equal(t, reminder.Sending, b.get(t, id).State)
}
