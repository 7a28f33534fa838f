package store_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Schema version 32 mirrors the state columns of reminders into
// reminder_state, both ways: the previous release's statements (schema 31,
// commit 0dbb7c8) keep writing reminders while this release's store moves
// its statements onto reminder_state. During a rolling upgrade both run on
// the same rows, a dispatcher of one release claiming what a worker of the
// other sends. Every mix of the two, move by move, over the happy path, a
// retry and an expiry must deliver each reminder once, refuse a stale or
// repeated move whichever release makes it, and leave the same timeline.

// v31 are internal/store's statements as schema version 31 ran them
// (git show 0dbb7c8:internal/store/queries.sql).
func v31(t *testing.T) sqlfile.Queries {
	t.Helper()
	src, err := os.ReadFile("testdata/queries_v31.sql")
	require.NoError(t, err)
	return sqlfile.Parse("testdata/queries_v31.sql", string(src))
}

// release makes the moves of one release's dispatcher (claim and its
// publish confirmation), worker (attempt and outcome) and reconciler
// (expiry).
type release struct {
	name string
	// claim returns the fence of each reminder it enqueued.
	claim func(t *testing.T, b bundle, now time.Time) map[int64]int64
	// attempt returns the attempt claimed, ok false when none was.
	attempt func(t *testing.T, b bundle, now time.Time, f store.Fenced) (a store.Attempt, ok bool)
	// outcome says whether the reminder moved.
	outcome func(t *testing.T, b bundle, now time.Time, o store.Outcome) bool
	// expire returns how many reminders it expired.
	expire func(t *testing.T, b bundle, now time.Time) int
}

func thisRelease() release {
	ctx := context.Background()
	return release{
		name: "new",
		claim: func(t *testing.T, b bundle, now time.Time) map[int64]int64 {
			claimed, err := b.st.ClaimDue(ctx, now, now, 100, time.Minute, "d")
			require.NoError(t, err)
			out, batches := map[int64]int64{}, map[int64]int{}
			for _, c := range claimed {
				if c.State == reminder.Enqueued {
					out[c.ID] = c.Fence
					batches[c.Batch]++
				}
			}
			require.NoError(t, b.st.ConfirmPublished(ctx, now, batches, "d"))
			return out
		},
		attempt: func(t *testing.T, b bundle, now time.Time, f store.Fenced) (store.Attempt, bool) {
			_, got, err := b.st.ClaimForDelivery(ctx, now, reminder.Email, "", []store.Fenced{f}, time.Minute, "w")
			require.NoError(t, err)
			a, ok := got[f.ID]
			return a, ok
		},
		outcome: func(t *testing.T, b bundle, now time.Time, o store.Outcome) bool {
			moved, err := b.st.RecordOutcomes(ctx, now, []store.Outcome{o}, "w")
			require.NoError(t, err)
			return moved[o.ReminderID]
		},
		expire: func(t *testing.T, b bundle, now time.Time) int {
			n, err := b.st.ExpireOverdue(ctx, now, 100, "r")
			require.NoError(t, err)
			return n
		},
	}
}

// previousRelease runs the frozen statements with the arguments
// 0dbb7c8's store gave them.
func previousRelease(t *testing.T) release {
	ctx := context.Background()
	q := v31(t)
	query := func(t *testing.T, b bundle, name string, args pgx.NamedArgs) [][]any {
		t.Helper()
		rows, err := b.db.Pool.Query(ctx, q.Get(name), args)
		require.NoError(t, err, name)
		var out [][]any
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err, name)
			out = append(out, vals)
		}
		require.NoError(t, rows.Err(), name)
		return out
	}
	return release{
		name: "v31",
		claim: func(t *testing.T, b bundle, now time.Time) map[int64]int64 {
			// id, state, fence, channel, tenant, idempotency_key, deadline,
			// attempts, due_at, dispatch_batch, ...
			out, batches := map[int64]int64{}, map[int64]int32{}
			for _, r := range query(t, b, "ClaimDue", pgx.NamedArgs{"now": now, "cutoff": now, "limit": 100,
				"lease_until": now.Add(time.Minute), "actor": "d"}) {
				if r[1] == string(reminder.Enqueued) {
					out[r[0].(int64)] = r[2].(int64)
					batches[r[9].(int64)]++
				}
			}
			var ids []int64
			var counts []int32
			for id, n := range batches {
				ids, counts = append(ids, id), append(counts, n)
			}
			query(t, b, "ConfirmPublished", pgx.NamedArgs{"now": now, "batches": ids, "confirmed": counts, "actor": "d"})
			return out
		},
		attempt: func(t *testing.T, b bundle, now time.Time, f store.Fenced) (store.Attempt, bool) {
			// ..., then the claim's fence, attempt number and attempt id
			// (NULL when not claimed).
			for _, r := range query(t, b, "ClaimForDelivery", pgx.NamedArgs{"now": now, "channel": "email",
				"provider": "", "ids": []int64{f.ID}, "fences": []int64{f.Fence}, "lease_until": now.Add(time.Minute),
				"actor": "w"}) {
				n := len(r)
				if r[0].(int64) == f.ID && r[n-1] != nil {
					return store.Attempt{ReminderID: f.ID, Fence: r[n-3].(int64), Number: int(r[n-2].(int32)),
						AttemptID: r[n-1].(int64)}, true
				}
			}
			return store.Attempt{}, false
		},
		outcome: func(t *testing.T, b bundle, now time.Time, o store.Outcome) bool {
			var next []*time.Time
			next = append(next, o.NextAttemptAt)
			rows := query(t, b, "RecordOutcomes", pgx.NamedArgs{"now": now, "ids": []int64{o.ReminderID},
				"fences": []int64{o.Fence}, "attempt_ids": []int64{o.AttemptID}, "states": []string{string(o.State())},
				"codes": []string{string(o.Code)}, "results": []string{string(o.Attempt)},
				"outcomes": []string{o.Attempt.Legacy()}, "next_attempts": next, "errors": []string{o.Error},
				"reasons": []string{o.Reason}, "provider_ids": []string{o.ProviderID}, "actor": "w"})
			return len(rows) == 1
		},
		expire: func(t *testing.T, b bundle, now time.Time) int {
			n := 0
			for _, r := range query(t, b, "ExpireOverdue", pgx.NamedArgs{"now": now, "limit": 100, "actor": "r",
				"hold_channels": []string{}, "hold_for": time.Duration(0), "looked": []int64{}}) {
				n += int(r[1].(int64))
			}
			return n
		},
	}
}

// step is one move of a path, at t0 plus at.
type step struct {
	kind string // "claim", "attempt", "retry", "deliver", "expire"
	at   time.Duration
}

// mixPath is a reminder's way through the pipeline.
type mixPath struct {
	name     string
	deadline time.Duration // after t0
	steps    []step
	// want is the timeline after the scheduled event, as code, fence and
	// states.
	want     []string
	state    reminder.State
	attempts int
}

var mixPaths = []mixPath{
	{"happy path", time.Hour, []step{{"claim", time.Second}, {"attempt", 2 * time.Second}, {"deliver", 3 * time.Second}},
		[]string{"claimed 1 pending→enqueued", "attempt_claimed 2 enqueued→sending", "delivered 2 sending→delivered"},
		reminder.Delivered, 1},
	{"a retry, then delivered", time.Hour, []step{{"claim", time.Second}, {"attempt", 2 * time.Second},
		{"retry", 3 * time.Second}, {"attempt", 11 * time.Second}, {"deliver", 12 * time.Second}},
		[]string{"claimed 1 pending→enqueued", "attempt_claimed 2 enqueued→sending", "retry 2 sending→retrying",
			"attempt_claimed 3 retrying→sending", "delivered 3 sending→delivered"},
		reminder.Delivered, 2},
	{"a retry, then the deadline", 8 * time.Second, []step{{"claim", time.Second}, {"attempt", 2 * time.Second},
		{"retry", 3 * time.Second}, {"expire", 9 * time.Second}},
		[]string{"claimed 1 pending→enqueued", "attempt_claimed 2 enqueued→sending", "retry 2 sending→retrying",
			"deadline_passed 3 retrying→expired"},
		reminder.Expired, 1},
}

// TestMirrorEveryMixOfReleases runs each path once per mix: move i made by
// the previous release when bit i of the mix is set, by this one otherwise.
// Before each move the other release tries it with a stale fence, and
// after it repeats it: neither changes the row.
func TestMirrorEveryMixOfReleases(t *testing.T) {
	t.Parallel()
	for pi, p := range mixPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setupBeforeRollout(t) // the previous release runs before the after-rollout step
			ctx := context.Background()
			rels := [2]release{thisRelease(), previousRelease(t)}
			var first []move
			for mix := range 1 << len(p.steps) {
				label := ""
				for i := range p.steps {
					label += rels[mix>>i&1].name[:1] // n or v
				}
				id := b.schedule(t, fmt.Sprintf("path%d-%s", pi, label), t0.Add(-time.Minute), t0.Add(p.deadline))
				var fence int64
				var a store.Attempt
				unchanged := func(what string) {
					t.Helper()
					r := b.get(t, id)
					require.Equal(t, fence, r.Fence, "%s %s: %s changed the fence", p.name, label, what)
				}
				for i, s := range p.steps {
					rel, other := rels[mix>>i&1], rels[1-mix>>i&1]
					now := t0.Add(s.at)
					switch s.kind {
					case "claim":
						fence = rel.claim(t, b, now)[id]
						require.NotZero(t, fence, "%s %s: %s claimed it", p.name, label, rel.name)
						require.Empty(t, other.claim(t, b, now), "%s %s: %s claimed it again", p.name, label, other.name)
					case "attempt":
						_, ok := other.attempt(t, b, now, store.Fenced{ID: id, Fence: fence - 1})
						require.False(t, ok, "%s %s: %s claimed an attempt with a stale fence", p.name, label, other.name)
						unchanged(other.name + "'s stale attempt")
						var got bool
						a, got = rel.attempt(t, b, now, store.Fenced{ID: id, Fence: fence})
						require.True(t, got, "%s %s: %s claimed the attempt", p.name, label, rel.name)
						require.Equal(t, fence+1, a.Fence)
						_, ok = other.attempt(t, b, now, store.Fenced{ID: id, Fence: fence})
						require.False(t, ok, "%s %s: %s claimed the same message again", p.name, label, other.name)
						fence = a.Fence
						unchanged(other.name + "'s repeated attempt")
					case "retry", "deliver":
						o := store.Outcome{ReminderID: id, Fence: a.Fence, AttemptID: a.AttemptID,
							Code: reminder.CodeDelivered, Attempt: reminder.OutcomeDelivered, ProviderID: "pm-" + label}
						if s.kind == "retry" {
							next := t0.Add(s.at + 2*time.Second)
							o = store.Outcome{ReminderID: id, Fence: a.Fence, AttemptID: a.AttemptID, Code: reminder.CodeRetry,
								Attempt: reminder.OutcomeRetryable, NextAttemptAt: &next, Error: "HTTP 503",
								Reason: "provider answered 503"}
						}
						stale := o
						stale.Fence--
						require.False(t, other.outcome(t, b, now, stale), "%s %s: %s recorded with a stale fence",
							p.name, label, other.name)
						unchanged(other.name + "'s stale outcome")
						require.True(t, rel.outcome(t, b, now, o), "%s %s: %s recorded the outcome", p.name, label, rel.name)
						require.False(t, other.outcome(t, b, now, o), "%s %s: %s recorded it again", p.name, label, other.name)
						unchanged(other.name + "'s repeated outcome")
					case "expire":
						require.Equal(t, 1, rel.expire(t, b, now), "%s %s: %s expired it", p.name, label, rel.name)
						fence++
						require.Zero(t, other.expire(t, b, now), "%s %s: %s expired it again", p.name, label, other.name)
						unchanged(other.name + "'s repeated expiry")
					}
				}

				r := b.get(t, id)
				require.Equal(t, p.state, r.State, "%s %s", p.name, label)
				var attempts, delivered int
				require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE result = 'delivered')
					FROM delivery_attempts WHERE reminder_id = $1`, id).Scan(&attempts, &delivered))
				require.Equal(t, p.attempts, attempts, "%s %s: attempts", p.name, label)
				require.Equal(t, map[bool]int{true: 1, false: 0}[p.state == reminder.Delivered], delivered,
					"%s %s: delivered once", p.name, label)

				got := b.timeline(t, id)
				require.Equal(t, reminder.CodeScheduled, got[0].Code, "%s %s", p.name, label)
				got = got[1:]
				var codes []string
				for _, m := range got {
					codes = append(codes, fmt.Sprintf("%s %d %s→%s", m.Code, m.Fence, m.From, m.To))
				}
				require.Equal(t, p.want, codes, "%s %s: each move once, in order", p.name, label)
				if first == nil {
					first = got
				}
				require.Equal(t, first, got, "%s %s: the same timeline (times, actors, reasons) as all new", p.name, label)
			}

			var differ int
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM reminders r JOIN reminder_state s USING (id)
				WHERE (r.state, r.fence, r.reason, r.finished_at) IS DISTINCT FROM (s.state, s.fence, s.reason, s.finished_at)`).
				Scan(&differ))
			require.Zero(t, differ, "both tables say the same")
		})
	}
}
