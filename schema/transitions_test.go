package schema_test

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/retention"
	"github.com/nudgehq/nudge/internal/sqlfile"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// This file checks every statement that writes reminders against the one
// transition table, pkg/reminder's Transitions. Each writer below is run
// against a table holding a row in every state, in every combination of the
// conditions the statements test (due or not, deadline passed or not,
// dispatch or send lease live, expired or absent, republish bound reached,
// batch confirmed), and each row's state before and after, and the event the
// statement appended, must be a transition the table lists, for that
// statement, by the writer's kind, with its code. A second test finds every
// statement that writes reminders in the repository's SQL (named statements
// of .sql files, SQL functions of the migrations) and fails on one that is
// not registered here, and on SQL that writes reminders from a Go string.

// repoRoot is the module root, seen from this package's directory.
const repoRoot = ".."

// migrationsFile names the migrations in the registry: SQL functions are
// registered by name, whichever migration (re)defines them.
const migrationsFile = "schema/migrations"

// tNow is the time of every run.
var tNow = time.Date(2026, 8, 12, 9, 0, 0, 0, time.UTC)

// writer is a statement that writes reminders, with how to run it once
// against every fixture row.
type writer struct {
	// file is the statement's .sql file, relative to the module root, or
	// migrationsFile for a SQL function.
	file string
	// name is the statement's name in file, or the function's (without the
	// _unchecked suffix version 2 gave the bodies it wrapped).
	name string
	// actors are the kinds of writer that run it: each transition it makes
	// must be allowed for every one of them.
	actors []reminder.Actor
	// runs each run the statement once over every row of the fixture.
	runs []writerRun
	// columnsOnly: it writes columns of reminders but never moves one
	// (nor bumps its fence); a run that does fails.
	columnsOnly bool
}

type writerRun struct {
	label string
	exec  func(t *testing.T, f *fixture)
}

func (w writer) key() string { return w.file + ": " + w.name }

// writers is the registry. A statement that writes reminders and is not in
// it fails TestEveryStatementWritingRemindersIsChecked.
func writers() []writer {
	one := func(label string, exec func(t *testing.T, f *fixture)) []writerRun {
		return []writerRun{{label, exec}}
	}
	storeSQL, opsSQL := "internal/store/queries.sql", "internal/ops/queries.sql"
	intakeSQL, retentionSQL := "pkg/intake/queries.sql", "internal/retention/queries.sql"
	ctx := context.Background()
	var outcomeRuns []writerRun
	for _, tr := range reminder.Transitions {
		if tr.From != reminder.Sending || tr.Actor != reminder.Worker {
			continue
		}
		code := tr.Code
		outcomeRuns = append(outcomeRuns, writerRun{string(code), func(t *testing.T, f *fixture) {
			var next *time.Time
			if code == reminder.CodeRetry {
				n := tNow.Add(time.Minute)
				next = &n
			}
			outs := make([]store.Outcome, 0, len(f.rows))
			for _, r := range f.rows {
				outs = append(outs, store.Outcome{ReminderID: r.id, Fence: r.fence, AttemptID: r.attemptID, Code: code,
					Attempt: reminder.OutcomeRetryable, NextAttemptAt: next, Reason: string(code)})
			}
			_, err := f.st.RecordOutcomes(ctx, tNow, outs, "w")
			require.NoError(t, err)
		}})
	}
	type fencedMove = func(*store.Store, context.Context, time.Time, []store.Fenced, string, string) (map[int64]bool, error)
	settle := func(m fencedMove) func(t *testing.T, f *fixture) {
		return func(t *testing.T, f *fixture) {
			_, err := m(f.st, ctx, tNow, f.fenced(), "w", "settled")
			require.NoError(t, err)
		}
	}
	dlq := func(name string) func(t *testing.T, f *fixture) {
		return func(t *testing.T, f *fixture) {
			ids, fences := f.idsAndFences()
			f.exec(t, f.named(t, opsSQL, name), pgx.NamedArgs{"ids": ids, "fences": fences, "now": tNow,
				"min_deadline": tNow, "reset_attempts": false, "actor": "op", "reason": "dlq: test"})
		}
	}
	return []writer{
		{file: storeSQL, name: "ClaimDue", actors: []reminder.Actor{reminder.Dispatcher}, runs: []writerRun{
			{"", func(t *testing.T, f *fixture) {
				_, err := f.st.ClaimDue(ctx, tNow, tNow, 10000, time.Minute, "d")
				require.NoError(t, err)
			}},
			// The tenant's send window is closed at tNow (09:00 UTC) and
			// opens before the fixture's live deadlines (10:00), or after them.
			{"window closed", claimInWindow("09:30", "23:00")},
			{"no window before the deadline", claimInWindow("22:00", "23:00")},
		}},
		{file: "internal/dispatch/queries.sql", name: "ExpireDue", actors: []reminder.Actor{reminder.Dispatcher},
			runs: one("", func(t *testing.T, f *fixture) {
				_, err := dispatch.ExpireDue(ctx, f.st.Pool(), tNow, tNow, 10000, "d")
				require.NoError(t, err)
			})},
		// The promoter (schema 38) inserts the state row of a lazy reminder,
		// pending as intake left it: it moves no reminder (a lazy reminder
		// is pending with its state row or without), and finds the fixture's
		// rows promoted already.
		{file: storeSQL, name: "Promote", actors: []reminder.Actor{reminder.Dispatcher}, columnsOnly: true,
			runs: one("", func(t *testing.T, f *fixture) {
				_, err := f.st.Promote(ctx, tNow.Add(time.Hour), time.Hour, 10000)
				require.NoError(t, err)
			})},
		{file: storeSQL, name: "Reclaim", actors: []reminder.Actor{reminder.Reconciler},
			runs: one("", func(t *testing.T, f *fixture) {
				_, err := f.st.Reclaim(ctx, tNow, time.Minute, 10000, time.Minute, "r")
				require.NoError(t, err)
			})},
		{file: storeSQL, name: "Release", actors: []reminder.Actor{reminder.Dispatcher, reminder.Reconciler},
			runs: one("", settle((*store.Store).Release))},
		{file: storeSQL, name: "ResolveExpiredLeases", actors: []reminder.Actor{reminder.Reconciler},
			runs: one("", func(t *testing.T, f *fixture) {
				_, _, err := f.st.ResolveExpiredLeases(ctx, tNow, 10000, "r")
				require.NoError(t, err)
			})},
		{file: storeSQL, name: "ExpireOverdue", actors: []reminder.Actor{reminder.Reconciler}, runs: []writerRun{
			{"", func(t *testing.T, f *fixture) {
				_, err := f.st.ExpireOverdue(ctx, tNow, 10000, "r")
				require.NoError(t, err)
			}},
			// Holding the fixture's channel for lookups (every row has an
			// attempt of unknown outcome), all of them looked up: they
			// expire as above.
			{"holding for lookups", func(t *testing.T, f *fixture) {
				ids, _ := f.idsAndFences()
				_, err := f.st.ExpireOverdueHolding(ctx, tNow, 10000, "r",
					store.Hold{Channels: []reminder.Channel{reminder.Email}, For: time.Hour, Looked: ids})
				require.NoError(t, err)
			}},
		}},
		{file: storeSQL, name: "SettledByLookup", actors: []reminder.Actor{reminder.Reconciler},
			runs: one("", func(t *testing.T, f *fixture) {
				var ss []store.Settled
				for _, fe := range f.fenced() {
					ss = append(ss, store.Settled{Fenced: fe, Reason: "settled by lookup"})
				}
				_, err := f.st.SettledByLookup(ctx, tNow, ss, "r")
				require.NoError(t, err)
			})},
		{file: storeSQL, name: "SettleQueued", actors: []reminder.Actor{reminder.Worker}, runs: []writerRun{
			{"Quarantine", settle((*store.Store).Quarantine)},
			{"ExpireFenced", settle((*store.Store).ExpireFenced)},
			{"ExpireEarly", settle((*store.Store).ExpireEarly)},
			{"FoundAtProvider", settle((*store.Store).FoundAtProvider)},
			{"ExpireNoWindow", settle((*store.Store).ExpireNoWindow)},
		}},
		{file: storeSQL, name: "ClaimForDelivery", actors: []reminder.Actor{reminder.Worker}, runs: []writerRun{
			{"", func(t *testing.T, f *fixture) {
				_, _, err := f.st.ClaimForDelivery(ctx, tNow, reminder.Email, "", f.fenced(), time.Minute, "w")
				require.NoError(t, err)
			}},
			// No attempt yet: the first one from enqueued is folded into
			// the row (schema version 30), the others stored.
			{"first attempt", func(t *testing.T, f *fixture) {
				f.exec(t, `UPDATE reminder_state SET attempts = 0`)
				_, _, err := f.st.ClaimForDelivery(ctx, tNow, reminder.Email, "", f.fenced(), time.Minute, "w")
				require.NoError(t, err)
			}},
		}},
		{file: storeSQL, name: "RecordOutcomes", actors: []reminder.Actor{reminder.Worker}, runs: outcomeRuns},
		{file: storeSQL, name: "Defer", actors: []reminder.Actor{reminder.Worker}, columnsOnly: true,
			runs: one("", func(t *testing.T, f *fixture) {
				untils := make([]time.Time, len(f.rows))
				for i := range untils {
					untils[i] = tNow.Add(time.Minute)
				}
				_, err := f.st.Defer(ctx, tNow, f.fenced(), untils)
				require.NoError(t, err)
			})},
		{file: opsSQL, name: "Replay", actors: []reminder.Actor{reminder.Operator},
			// The statement itself, offered every state (ops.Replay lets an
			// operator pick only the replayable ones).
			runs: one("", func(t *testing.T, f *fixture) {
				states := make([]string, len(reminder.States))
				for i, s := range reminder.States {
					states[i] = string(s)
				}
				f.exec(t, f.named(t, opsSQL, "Replay"), pgx.NamedArgs{
					"now": tNow, "min_deadline": tNow, "ids": []int64{}, "due_from": nil, "due_to": nil,
					"channel": "", "tenant": "", "states": states, "stuck_before": tNow, "limit": 10000,
					"reset_attempts": false, "apply": true, "actor": "op", "reason": "replay: test", "after": 0,
				})
			})},
		{file: opsSQL, name: "DLQReplay", actors: []reminder.Actor{reminder.Operator}, runs: one("", dlq("DLQReplay"))},
		{file: opsSQL, name: "DLQExpire", actors: []reminder.Actor{reminder.Operator}, runs: one("", dlq("DLQExpire"))},
		{file: intakeSQL, name: "ScheduleMany", actors: []reminder.Actor{reminder.Intake},
			// Every existing key again (same or other content) and a new one.
			runs: one("", func(t *testing.T, f *fixture) {
				reqs := []intake.Request{f.request("new")}
				for _, r := range f.rows {
					reqs = append(reqs, f.request(r.key))
				}
				_, err := intake.ScheduleMany(ctx, f.db.Pool, reqs)
				require.NoError(t, err)
			})},
		{file: migrationsFile, name: "nudge_try_schedule", actors: []reminder.Actor{reminder.Intake},
			runs: one("", func(t *testing.T, f *fixture) {
				for _, key := range append([]string{"new"}, f.keys()...) {
					r := f.request(key)
					f.exec(t, `SELECT nudge_try_schedule($1, $2, $3, $4, $5, '{}', $6, $7)`,
						r.Tenant, r.Key, r.Channel, r.Recipient, r.Template, r.DueAt, r.Deadline)
				}
			})},
		{file: migrationsFile, name: "nudge_cancel", actors: []reminder.Actor{reminder.Intake},
			runs: one("", func(t *testing.T, f *fixture) {
				for _, key := range f.keys() {
					_, err := intake.Cancel(ctx, f.db.Pool, "acme", key, "app", "unsubscribed")
					require.NoError(t, err)
				}
			})},
		{file: migrationsFile, name: "nudge_reschedule", actors: []reminder.Actor{reminder.Intake},
			runs: one("", func(t *testing.T, f *fixture) {
				for _, key := range f.keys() {
					_, err := intake.Reschedule(ctx, f.db.Pool, "acme", key, tNow.Add(time.Hour), tNow.Add(2*time.Hour),
						"app", "moved")
					require.NoError(t, err)
				}
			})},
		{file: migrationsFile, name: "nudge_reschedule_to", actors: []reminder.Actor{reminder.Intake},
			// Twice: the second run of the same times changes nothing.
			runs: one("", func(t *testing.T, f *fixture) {
				for range 2 {
					for _, key := range f.keys() {
						_, err := intake.RescheduleTo(ctx, f.db.Pool, "acme", key, tNow.Add(time.Hour), tNow.Add(2*time.Hour),
							"app", "moved")
						require.NoError(t, err)
					}
				}
			})},
		{file: migrationsFile, name: "nudge_reschedule_window", actors: []reminder.Actor{reminder.Intake},
			// Twice: the second run of the same times and window changes nothing.
			runs: one("", func(t *testing.T, f *fixture) {
				w, err := localtime.ParseWindow("mon-fri 08:00-21:00")
				require.NoError(t, err)
				for range 2 {
					for _, key := range f.keys() {
						_, err := intake.RescheduleWindow(ctx, f.db.Pool, "acme", key, tNow.Add(time.Hour),
							tNow.Add(2*time.Hour), &w, "app", "moved")
						require.NoError(t, err)
					}
				}
			})},
		{file: migrationsFile, name: "nudge_update", actors: []reminder.Actor{reminder.Intake},
			runs: one("", func(t *testing.T, f *fixture) {
				for range 2 {
					for _, key := range f.keys() {
						_, err := intake.Update(ctx, f.db.Pool, "acme", key, intake.Content{Recipient: "b@example.com",
							Data: map[string]any{"course": "Go 102"}}, "app", "new address")
						require.NoError(t, err)
					}
				}
			})},
		{file: migrationsFile, name: "nudge_cancel_prefix", actors: []reminder.Actor{reminder.Intake},
			// The fixture's keys are STATE-N: one prefix per state.
			runs: one("", func(t *testing.T, f *fixture) {
				for _, s := range reminder.States {
					_, err := intake.CancelPrefix(ctx, f.db.Pool, "acme", string(s)+"-", intake.MaxCancelPrefix, "app", "ineligible")
					require.NoError(t, err)
				}
			})},
		{file: retentionSQL, name: "DeleteReminders", actors: []reminder.Actor{reminder.Retention},
			runs: one("", retentionStatement("DeleteReminders", retention.DefaultReminderAfter))},
		{file: retentionSQL, name: "PurgePayloads", actors: []reminder.Actor{reminder.Retention}, columnsOnly: true,
			runs: one("", retentionStatement("PurgePayloads", retention.DefaultPayloadAfter))},
	}
}

// claimInWindow runs ClaimDue with the fixture tenant's send window set to
// open-close (UTC), then removes the policy again.
func claimInWindow(open, close string) func(t *testing.T, f *fixture) {
	return func(t *testing.T, f *fixture) {
		ctx := context.Background()
		f.exec(t, `INSERT INTO nudge_send_windows (tenant, channel, window_open, window_close) VALUES ('acme', 'email', $1, $2)`,
			open, close)
		defer f.exec(t, `DELETE FROM nudge_send_windows WHERE tenant = 'acme'`)
		_, err := f.st.ClaimDue(ctx, tNow, tNow, 10000, time.Minute, "d")
		require.NoError(t, err)
	}
}

// retentionStatement runs one statement of a retention pass with the window
// it is run with.
func retentionStatement(name string, window time.Duration) func(t *testing.T, f *fixture) {
	return func(t *testing.T, f *fixture) {
		f.exec(t, f.named(t, "internal/retention/queries.sql", name),
			pgx.NamedArgs{"now": tNow, "before": tNow.Add(-window), "limit": 10000})
	}
}

// fixture is a table of reminders in every state and condition.
type fixture struct {
	db   *testenv.DB
	st   *store.Store
	rows []fixtureRow
}

type fixtureRow struct {
	id, fence, attemptID int64
	key                  string
	state                reminder.State
}

func (f *fixture) fenced() []store.Fenced {
	out := make([]store.Fenced, len(f.rows))
	for i, r := range f.rows {
		out[i] = store.Fenced{ID: r.id, Fence: r.fence}
	}
	return out
}

func (f *fixture) idsAndFences() (ids, fences []int64) {
	for _, r := range f.rows {
		ids, fences = append(ids, r.id), append(fences, r.fence)
	}
	return ids, fences
}

func (f *fixture) keys() []string {
	out := make([]string, len(f.rows))
	for i, r := range f.rows {
		out[i] = r.key
	}
	return out
}

// request is what the fixture scheduled under key (a new key: new content).
func (f *fixture) request(key string) intake.Request {
	return intake.Request{Tenant: "acme", Key: key, Channel: reminder.Email, Recipient: "a@example.com",
		Template: "course-expiry", DueAt: tNow.Add(-2 * time.Hour), Deadline: tNow.Add(time.Hour)}
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	rows, err := f.db.Pool.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	rows.Close()
	require.NoError(t, rows.Err())
}

// named returns a statement of a .sql file, read as its package embeds it.
func (f *fixture) named(t *testing.T, file, name string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, file))
	require.NoError(t, err)
	return sqlfile.Parse(file, string(src)).Get(name)
}

// variant is one combination of the conditions statements test.
type variant struct {
	due, deadline time.Duration // from tNow
	lease         *time.Duration
	republishes   int
	confirmed     bool
}

func (v variant) String() string {
	lease := "none"
	if v.lease != nil {
		lease = v.lease.String()
	}
	return fmt.Sprintf("due%s/deadline%s/lease%s/rep%d/conf%t", v.due, v.deadline, lease, v.republishes, v.confirmed)
}

func variants() []variant {
	past, live := -time.Minute, time.Minute
	var out []variant
	for _, dd := range [][2]time.Duration{{-2 * time.Hour, time.Hour}, {-2 * time.Hour, -time.Minute}, {10 * time.Minute, time.Hour}} {
		for _, lease := range []*time.Duration{nil, &past, &live} {
			for _, rep := range []int{0, store.MaxRepublishes} {
				for _, conf := range []bool{false, true} {
					out = append(out, variant{due: dd[0], deadline: dd[1], lease: lease, republishes: rep, confirmed: conf})
				}
			}
		}
	}
	return out
}

// newFixture empties db's tables of reminders, then inserts a reminder in
// every state and variant, each with one attempt still open (its outcome
// unknown); a terminal one with its claim and first attempt folded into its
// row (and a delivered one its delivery).
func newFixture(t *testing.T, db *testenv.DB) *fixture {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `TRUNCATE reminders, reminder_state, reminder_events, delivery_attempts, publish_confirms`)
	require.NoError(t, err)
	f := &fixture{db: db, st: store.New(db.Pool)}
	var (
		keys, states                  []string
		dues, deadlines, leases, fins []*time.Time
		republishes                   []int32
		batches, confirmed            []int64
	)
	at := func(d time.Duration) *time.Time { x := tNow.Add(d); return &x }
	for _, s := range reminder.States {
		for i, v := range variants() {
			key := fmt.Sprintf("%s-%d", s, i)
			var lease, finished *time.Time
			if v.lease != nil {
				lease = at(*v.lease)
			}
			if s.Terminal() {
				// Past the reminder window, or only past the payload window.
				finished = at(-400 * 24 * time.Hour)
				if v.republishes > 0 {
					finished = at(-10 * 24 * time.Hour)
				}
			}
			batch := int64(1_000_000 + len(keys))
			if v.confirmed {
				confirmed = append(confirmed, batch)
			}
			keys, states = append(keys, key), append(states, string(s))
			dues, deadlines = append(dues, at(v.due)), append(deadlines, at(v.deadline))
			leases, fins = append(leases, lease), append(fins, finished)
			republishes, batches = append(republishes, int32(v.republishes)), append(batches, batch)
		}
	}
	rows, err := db.Pool.Query(ctx, `
		WITH u AS (
			SELECT * FROM unnest(@keys::text[], @states::text[], @dues::timestamptz[], @deadlines::timestamptz[],
			                     @leases::timestamptz[], @republishes::int[], @finished::timestamptz[], @batches::bigint[])
			       AS u(key, state, due, deadline, lease, republishes, finished, batch)
		), w AS (
			INSERT INTO reminders (tenant, key, channel, recipient, template, due_at, deadline, idempotency_key)
			SELECT 'acme', u.key, 'email', 'a@example.com', 'course-expiry', u.due, u.deadline,
			       nudge_idempotency_key('acme', u.key)
			  FROM u
			RETURNING id, key
		), r AS (
			INSERT INTO reminder_state (id, tenant, channel, due_at, deadline,
			                            state, fence, lease_until, attempts, republishes, next_attempt_at,
			                            enqueued_at, finished_at, dispatch_batch, updated_at,
			                            claimed_at, claimed_fence, claimed_by, started_at, started_fence, started_by,
			                            delivered_by)
			SELECT w.id, 'acme', 'email', u.due, u.deadline, u.state, 5, u.lease, 1, u.republishes, @overdue,
			       @overdue, u.finished, u.batch, @overdue,
			       -- terminal rows hold their happy path's events folded
			       -- (schema version 30), for retention to keep
			       CASE WHEN u.finished IS NOT NULL THEN u.finished - interval '2 minutes' END,
			       CASE WHEN u.finished IS NOT NULL THEN 3 END, CASE WHEN u.finished IS NOT NULL THEN 'd' END,
			       CASE WHEN u.finished IS NOT NULL THEN u.finished - interval '1 minute' END,
			       CASE WHEN u.finished IS NOT NULL THEN 4 END, CASE WHEN u.finished IS NOT NULL THEN 'w' END,
			       CASE WHEN u.state = 'delivered' THEN 'w' END
			  FROM w JOIN u ON u.key = w.key
			RETURNING id, state, fence
		), a AS (
			INSERT INTO delivery_attempts (reminder_id, attempt, fence, worker, started_at)
			SELECT id, 1, fence, 'w', @overdue FROM r
			RETURNING reminder_id, id
		), c AS (
			INSERT INTO publish_confirms (batch, confirmed_at, actor, confirmed)
			SELECT b, @overdue, 'd', 1 FROM unnest(@confirmed::bigint[]) AS b
		)
		SELECT r.id, r.fence, a.id, w.key, r.state FROM r JOIN w ON w.id = r.id JOIN a ON a.reminder_id = r.id
		 ORDER BY r.id`,
		pgx.NamedArgs{"keys": keys, "states": states, "dues": dues, "deadlines": deadlines, "leases": leases,
			"republishes": republishes, "finished": fins, "batches": batches, "confirmed": confirmed,
			"overdue": tNow.Add(-time.Hour)})
	require.NoError(t, err)
	f.rows, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (fixtureRow, error) {
		var x fixtureRow
		return x, r.Scan(&x.id, &x.fence, &x.attemptID, &x.key, &x.state)
	})
	require.NoError(t, err)
	require.Len(t, f.rows, len(keys))
	return f
}

type rowState struct {
	state reminder.State
	fence int64
}

// trail is every event of the reminders' timelines (reminder_timeline:
// stored in reminder_events or folded into the row, schema version 30), each
// counted by what it says, whichever of the two holds it: an event folded
// into a row and later stored (DeleteReminders) is the same event.
type trail map[string]int

func (f *fixture) snapshot(t *testing.T) (map[int64]rowState, trail) {
	t.Helper()
	ctx := context.Background()
	rows, err := f.db.Pool.Query(ctx, `SELECT id, state, fence FROM reminder_state`)
	require.NoError(t, err)
	out := map[int64]rowState{}
	var id int64
	var s rowState
	_, err = pgx.ForEachRow(rows, []any{&id, &s.state, &s.fence}, func() error { out[id] = s; return nil })
	require.NoError(t, err)
	tr := trail{}
	for _, e := range f.timeline(t) {
		tr[e.key]++
	}
	return out, tr
}

type event struct {
	reminder int64
	from, to reminder.State
	code     *string
	key      string // what the event says: reminder, states, fence, actor, code, reason, time
	folded   bool   // held by the reminder's row (schema version 30), not reminder_events
}

// timeline reads every reminder's timeline, each in its order.
func (f *fixture) timeline(t *testing.T) []event {
	t.Helper()
	rows, err := f.db.Pool.Query(context.Background(),
		`SELECT reminder_id, coalesce(from_state, ''), to_state, code,
		        concat_ws('|', reminder_id, from_state, to_state, fence, actor, code, reason, at), id IS NULL
		   FROM reminder_timeline ORDER BY reminder_id, seq`)
	require.NoError(t, err)
	var out []event
	var e event
	_, err = pgx.ForEachRow(rows, []any{&e.reminder, &e.from, &e.to, &e.code, &e.key, &e.folded}, func() error {
		out = append(out, e)
		return nil
	})
	require.NoError(t, err)
	return out
}

// eventsAfter returns the events of the timelines that before does not
// hold, by reminder, and fails on an event of before that is gone: no
// statement takes an event off a timeline (a deleted reminder's stay).
func (f *fixture) eventsAfter(t *testing.T, name string, before trail) map[int64][]event {
	t.Helper()
	left := maps.Clone(before)
	out := map[int64][]event{}
	for _, e := range f.timeline(t) {
		if left[e.key] > 0 {
			left[e.key]--
			continue
		}
		out[e.reminder] = append(out[e.reminder], e)
	}
	for k, n := range left {
		require.Zero(t, n, "%s: the event %s is no longer on its reminder's timeline", name, k)
	}
	return out
}

// observed is one transition a statement made.
type observed struct {
	from, to reminder.State
	actor    reminder.Actor
	code     reminder.Code
}

// check compares what a run did with the table and returns the transitions
// it made. A failure names the row's state before and after.
func check(t *testing.T, w writer, before, after map[int64]rowState, events map[int64][]event,
	foldedMoves map[observed]bool) []observed {
	t.Helper()
	ids := map[int64]bool{}
	for id := range before {
		ids[id] = true
	}
	for id := range after {
		ids[id] = true
	}
	var out []observed
	for id := range ids {
		b, existed := before[id]
		a, exists := after[id]
		// Notes (reminder.Notes) are events that are not transitions: they
		// keep the state, and are left out of the comparison.
		var evs []event
		for _, e := range events[id] {
			if e.code != nil && reminder.IsNote(reminder.Code(*e.code)) {
				require.Equal(t, e.from, e.to, "%s: reminder %d has a %s note that changes its state", w.key(), id, *e.code)
				continue
			}
			evs = append(evs, e)
		}
		from, to := reminder.None, reminder.None
		if existed {
			from = b.state
		}
		if exists {
			to = a.state
		}
		if existed && exists && b == a && len(evs) == 0 {
			continue // untouched, or columns changed within its state (no transition)
		}
		var code reminder.Code
		folded := false
		if to == reminder.None {
			require.Empty(t, evs, "%s deleted reminder %d: deletions leave no event", w.key(), id)
		} else {
			require.Len(t, evs, 1, "%s: reminder %d %s → %s (fence %d → %d) with %d events: a transition "+
				"(a new fence included) appends exactly one", w.key(), id, from, to, b.fence, a.fence, len(evs))
			e := evs[0]
			require.Equal(t, [2]reminder.State{from, to}, [2]reminder.State{e.from, e.to},
				"%s: reminder %d's event does not say what happened", w.key(), id)
			require.NotNil(t, e.code, "%s: reminder %d %s → %s: the event has no code", w.key(), id, from, to)
			code = reminder.Code(*e.code)
			folded = e.folded
		}
		for _, actor := range w.actors {
			tr, ok := findTransition(from, to, actor, code)
			require.True(t, ok, "%s moved reminder %d %s → %s with code %q, a transition reminder.Transitions "+
				"does not allow %s", w.key(), id, show(from), show(to), code, actor)
			require.Contains(t, strings.Split(tr.Statement, ", "), w.name,
				"%s makes %s, which reminder.Transitions attributes to %q", w.key(), tr, tr.Statement)
			require.False(t, folded && tr.Folded == "", "%s folded the event of %s into reminder %d's row, "+
				"which reminder.Transitions does not mark as folded", w.key(), tr, id)
			if folded {
				foldedMoves[observed{from, to, actor, tr.Code}] = true
			}
			out = append(out, observed{from, to, actor, tr.Code})
		}
	}
	return out
}

// findTransition finds a row of the table; a deletion matches on states and
// actor alone (it has no event to carry a code).
func findTransition(from, to reminder.State, a reminder.Actor, c reminder.Code) (reminder.Transition, bool) {
	i := slices.IndexFunc(reminder.Transitions, func(t reminder.Transition) bool {
		return !t.Legacy && t.From == from && t.To == to && t.Actor == a && (t.Code == c || to == reminder.None)
	})
	if i < 0 {
		return reminder.Transition{}, false
	}
	return reminder.Transitions[i], true
}

func show(s reminder.State) string {
	if s == reminder.None {
		return "(none)"
	}
	return string(s)
}

// TestEveryWriterMakesOnlyAllowedTransitions runs every registered
// statement over a reminder in every state and condition, and checks what it
// did against reminder.Transitions; then that every row of the table (but
// the legacy ones) is made by some statement, so the table says no more than
// the code does.
func TestEveryWriterMakesOnlyAllowedTransitions(t *testing.T) {
	t.Parallel()
	made, folded := map[observed]bool{}, map[observed]bool{}
	db := testenv.Postgres(t)
	for _, w := range writers() {
		for _, r := range w.runs {
			name := w.key()
			if r.label != "" {
				name += " (" + r.label + ")"
			}
			f := newFixture(t, db)
			before, trailBefore := f.snapshot(t)
			r.exec(t, f)
			after, _ := f.snapshot(t)
			got := check(t, w, before, after, f.eventsAfter(t, name, trailBefore), folded)
			if w.columnsOnly {
				require.Empty(t, got, "%s moved reminders: it is registered as writing columns only", name)
			} else {
				require.NotEmpty(t, got, "%s made no transition from any fixture row: the fixture misses what it needs", name)
			}
			for _, o := range got {
				made[o] = true
			}
		}
	}
	for _, tr := range reminder.Transitions {
		if tr.Legacy {
			continue
		}
		require.True(t, made[observed{tr.From, tr.To, tr.Actor, tr.Code}],
			"reminder.Transitions lists %s, but no statement made it from any fixture row", tr)
		// A transition marked folded is folded by its statement (schema
		// version 30): the fixture offers every slot empty.
		require.Equal(t, tr.Folded != "", folded[observed{tr.From, tr.To, tr.Actor, tr.Code}],
			"reminder.Transitions marks %s folded %q: its statement must fold it (and no other)", tr, tr.Folded)
	}
}

// writesReminders matches SQL that changes rows of reminders or of their
// state rows (reminder_state, schema version 32).
var writesReminders = regexp.MustCompile(`(?i)\b(update|insert\s+into|delete\s+from)\s+(reminders|reminder_state)\b`)

// copiesState are the statements that write reminders or reminder_state
// only to copy one table's state columns to the other (the mirror triggers
// of migration 32 and the backfill before 33): they make no transition of
// their own, the statement that fired them does, and that statement is
// checked. schema/state_mirror_test.go checks the copies. nudge_materialize
// (39) copies a reminder's intent from its wide row to the state row it
// lacks: pending before (no row reads as pending) and after, no event; the
// writes that call it are checked, and schema/unpromoted_test.go checks it.
var copiesState = map[string]bool{
	migrationsFile + ": nudge_materialize":           true,
	migrationsFile + ": nudge_state_mirror_inserted": true,
	migrationsFile + ": nudge_state_mirror_updated":  true,
	migrationsFile + ": nudge_state_mirror_back":     true,
	"schema/queries.sql: BackfillState":              true,
}

// createFunction finds SQL function definitions in a migration.
var createFunction = regexp.MustCompile(`(?is)CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(\w+)\s*\(.*?\$\$(.*?)\$\$`)

// goFixtures are Go files allowed to write reminders directly: test helpers
// that insert rows in any state, or delete state rows (testenv's Unpromote).
var goFixtures = map[string]bool{
	"internal/ops/opstest/opstest.go": true,
	"internal/testenv/postgres.go":    true,
}

// writingStatements finds every statement of the module that writes
// reminders: named statements of .sql files, and SQL functions of the
// migrations. Modules nested in the tree (bench) and testdata are not Nudge's.
func writingStatements(t *testing.T) (found []string, problems []string) {
	t.Helper()
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			// testdata holds earlier versions' statements, run by the
			// rolling-upgrade tests (internal/store/testdata), not by Nudge.
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" ||
				fileExists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		text := string(src)
		switch {
		case strings.HasPrefix(rel, migrationsFile+"/") && strings.HasSuffix(rel, ".sql"):
			rest := text
			for _, m := range createFunction.FindAllStringSubmatch(text, -1) {
				rest = strings.Replace(rest, m[0], "", 1)
				name := migrationsFile + ": " + strings.TrimSuffix(m[1], "_unchecked")
				if writesReminders.MatchString(m[2]) && !copiesState[name] {
					found = append(found, name)
				}
			}
			if writesReminders.MatchString(stripComments(rest)) {
				problems = append(problems, rel+" writes reminders outside a SQL function: check it against "+
					"reminder.Transitions and run it here")
			}
		case strings.HasSuffix(rel, ".sql"):
			qs := sqlfile.Parse(rel, text)
			for _, name := range qs.Names() {
				if writesReminders.MatchString(qs.Get(name)) && !copiesState[rel+": "+name] {
					found = append(found, rel+": "+name)
				}
			}
		case strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") && !goFixtures[rel]:
			if writesReminders.MatchString(text) {
				problems = append(problems, rel+" writes reminders from a Go string: move the statement to a "+
					".sql file (internal/sqlfile) and register it here")
			}
		}
		return nil
	})
	require.NoError(t, err)
	sort.Strings(found)
	return slices.Compact(found), problems
}

func stripComments(sql string) string {
	var b strings.Builder
	for _, l := range strings.Split(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "--") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestEveryStatementWritingRemindersIsChecked fails on a statement that
// writes reminders but is not run by TestEveryWriterMakesOnlyAllowedTransitions,
// and on a registered one that no longer exists.
func TestEveryStatementWritingRemindersIsChecked(t *testing.T) {
	t.Parallel()
	found, problems := writingStatements(t)
	require.Empty(t, problems)
	require.NotEmpty(t, found)
	var registered []string
	for _, w := range writers() {
		registered = append(registered, w.key())
	}
	for _, s := range found {
		require.Contains(t, registered, s, "%s writes reminders but is not checked against reminder.Transitions: "+
			"register it in writers() (schema/transitions_test.go)", s)
	}
	for _, r := range registered {
		require.Contains(t, found, r, "writers() registers %s, which writes no reminders (or no longer exists)", r)
	}
}
