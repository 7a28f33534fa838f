package schema_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/ctl"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/metrics"
	"github.com/nudgehq/nudge/internal/retention"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
	"github.com/nudgehq/nudge/schema"
)

// The group roles 0002_roles.sql creates.
var groupRoles = []string{"nudge_intake", "nudge_dispatcher", "nudge_worker", "nudge_reconciler", "nudge_operator"}

type rolesBundle struct {
	db  *testenv.DB
	su  *store.Store // as the superuser that migrated the schema
	now time.Time
}

func setupRoles(t *testing.T) *rolesBundle {
	t.Helper()
	db := testenv.Postgres(t)
	return &rolesBundle{db: db, su: store.New(db.Pool), now: time.Now().UTC().Truncate(time.Microsecond)}
}

// login creates a LOGIN role for this test only, a member of group ("" for
// none), and returns a pool connected as it to the test's schema. The role is
// dropped when the test ends.
func (b *rolesBundle) login(t *testing.T, group string) (*pgxpool.Pool, string) {
	t.Helper()
	pool, name, _ := b.db.Login(t, group)
	var who string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT session_user`).Scan(&who))
	require.Equal(t, name, who)
	return pool, name
}

// grantTenant lets login act for tenant as nudge_intake ("*": every tenant).
func (b *rolesBundle) grantTenant(t *testing.T, login, tenant string) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `INSERT INTO nudge_intake_tenants (grantee, tenant) VALUES ($1, $2)`, login, tenant)
	require.NoError(t, err)
}

// schedule records a reminder as the superuser: email, due a minute ago.
func (b *rolesBundle) schedule(t *testing.T, tenant, key string, deadline time.Time) int64 {
	t.Helper()
	res, err := intake.Schedule(context.Background(), b.db.Pool, intake.Request{
		Tenant: tenant, Key: key, Channel: reminder.Email, Recipient: "learner@example.com",
		Template: "course-expiry", Data: map[string]any{"course": "Go 101"},
		DueAt: b.now.Add(-time.Minute), Deadline: deadline,
	})
	require.NoError(t, err)
	return res.ID
}

// enqueue claims every due reminder and records its publish confirmed, as
// the superuser, and returns the fences by id.
func (b *rolesBundle) enqueue(t *testing.T) map[int64]store.Fenced {
	t.Helper()
	ctx := context.Background()
	claimed, err := b.su.ClaimDue(ctx, b.now, b.now, 100, time.Minute, "seed")
	require.NoError(t, err)
	out := map[int64]store.Fenced{}
	batches := map[int64]int{}
	for _, c := range claimed {
		out[c.ID] = store.Fenced{ID: c.ID, Fence: c.Fence}
		batches[c.Batch]++
	}
	require.NoError(t, b.su.ConfirmPublished(ctx, b.now, batches, "seed"))
	return out
}

func (b *rolesBundle) state(t *testing.T, id int64) reminder.State {
	t.Helper()
	r, err := intake.Get(context.Background(), b.db.Pool, id)
	require.NoError(t, err)
	return r.State
}

// requireDenied runs sql and requires PostgreSQL to refuse it for lack of
// privilege (SQLSTATE 42501).
func requireDenied(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := pool.Exec(context.Background(), sql, args...)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "%s: want permission denied, got success", sql)
	require.Equal(t, "42501", pgErr.Code, "%s: want permission denied (42501), got %v", sql, err)
}

// count returns the number of rows of a query as pool's role sees them.
func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM (`+sql+`) q`, args...).Scan(&n), sql)
	return n
}

// Writes no component role may make: the rows' identity and content belong
// to intake (through the functions) and their removal to the owner.
var forbiddenToComponents = []string{
	`DELETE FROM reminders`,
	`TRUNCATE reminders CASCADE`,
	`UPDATE reminders SET tenant = 'evil'`,
	`UPDATE reminders SET key = 'evil'`,
	`UPDATE reminders SET recipient = 'evil@example.com'`,
	`UPDATE reminders SET data = '{}'`,
	`UPDATE reminders SET template = 'evil'`,
	`UPDATE reminders SET due_at = now(), deadline = now() + interval '1 hour'`,
	`UPDATE reminders SET idempotency_key = 'evil'`,
	`INSERT INTO reminders (tenant, key, channel, recipient, template, due_at, deadline, idempotency_key)
	 VALUES ('evil', 'k', 'email', 'evil@example.com', 't', now(), now() + interval '1 hour', 'x')`,
	`DELETE FROM reminder_events`,
	`UPDATE reminder_events SET reason = 'rewritten'`,
	`DELETE FROM delivery_attempts`,
	`UPDATE delivery_attempts SET reminder_id = 1`,
	`SELECT * FROM nudge_intake_tenants`,
	`INSERT INTO nudge_intake_tenants VALUES ('someone', '*')`,
	`CREATE TABLE evil (x int)`,
	`SELECT nudge_try_schedule_unchecked('acme', 'k', 'email', 'a@example.com', 't', '{}', now(), now() + interval '1 hour')`,
	`SELECT nudge_cancel_unchecked('acme', 'k')`,
}

func TestGroupRolesCannotLogInAndHoldNoAttributes(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	for _, r := range groupRoles {
		var login, super, createRole, createDB, bypassRLS bool
		err := b.db.Pool.QueryRow(context.Background(), `SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls
			FROM pg_roles WHERE rolname = $1`, r).Scan(&login, &super, &createRole, &createDB, &bypassRLS)
		require.NoError(t, err, "role %s", r)
		require.False(t, login || super || createRole || createDB || bypassRLS, "role %s must be a plain NOLOGIN group", r)
	}
}

func TestARoleOutsideTheGroupsCanDoNothing(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	pool, _ := b.login(t, "")
	// Qualified: without USAGE on the schema, unqualified names do not even resolve.
	s := pgx.Identifier{b.db.Schema}.Sanitize() + "."
	requireDenied(t, pool, `SELECT id FROM `+s+`reminders`)
	requireDenied(t, pool, `SELECT `+s+`nudge_schedule('acme', 'k', 'email', 'a@example.com', 't', '{}', now(), now() + interval '1 hour')`)
	requireDenied(t, pool, `SELECT `+s+`nudge_cancel('acme', 'k')`)
}

func TestDispatcherRoleRunsItsStatementsOnly(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	pool, login := b.login(t, "nudge_dispatcher")
	st := store.New(pool)
	hour := b.now.Add(time.Hour)
	a, c := b.schedule(t, "acme", "a", hour), b.schedule(t, "acme", "c", hour)
	late := b.schedule(t, "acme", "late", b.now.Add(-time.Second))

	claimed, err := st.ClaimDue(ctx, b.now, b.now, 10, time.Minute, login)
	require.NoError(t, err)
	require.Len(t, claimed, 3)
	fences := map[int64]store.Fenced{}
	for _, cl := range claimed {
		fences[cl.ID] = store.Fenced{ID: cl.ID, Fence: cl.Fence}
	}
	require.NoError(t, st.ConfirmPublished(ctx, b.now, map[int64]int{claimed[0].Batch: 2}, login))
	released, err := st.Release(ctx, b.now, []store.Fenced{fences[c]}, login, "publish not confirmed")
	require.NoError(t, err)
	require.True(t, released[c])
	require.Equal(t, reminder.Enqueued, b.state(t, a))
	require.Equal(t, reminder.Pending, b.state(t, c))
	require.Equal(t, reminder.Expired, b.state(t, late))

	// The promoter (schema 38): a lazy reminder's state row, the watermark.
	_, err = b.db.Pool.Exec(ctx, `UPDATE nudge_lazy_intake SET horizon = interval '2 hours'`)
	require.NoError(t, err)
	wall := time.Now()
	res, err := intake.Schedule(ctx, b.db.Pool, intake.Request{Tenant: "acme", Key: "lazy", Channel: reminder.Email,
		Recipient: "learner@example.com", Template: "course-expiry", DueAt: wall.Add(3 * time.Hour),
		Deadline: wall.Add(4 * time.Hour)})
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE nudge_lazy_intake SET horizon = interval '4 hours'`)
	require.NoError(t, err)
	p, err := st.Promote(ctx, wall.Add(4*time.Hour), 4*time.Hour, 10)
	require.NoError(t, err)
	require.EqualValues(t, 1, p.Promoted)
	require.Equal(t, reminder.Pending, b.state(t, res.ID))

	for _, sql := range append(forbiddenToComponents,
		// Nothing to do with attempts, and no personal data.
		`SELECT id FROM delivery_attempts`,
		`INSERT INTO delivery_attempts (reminder_id, attempt, fence, worker, started_at) VALUES (1, 1, 1, 'x', now())`,
		`SELECT recipient FROM reminders`,
		`SELECT data FROM reminders`,
		`SELECT template FROM reminders`,
		`UPDATE reminder_state SET attempts = 0`,
		`SELECT nudge_cancel('acme', 'a')`,
	) {
		requireDenied(t, pool, sql)
	}
}

func TestWorkerRoleRunsItsStatementsOnly(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	pool, login := b.login(t, "nudge_worker")
	st := store.New(pool)
	hour := b.now.Add(time.Hour)
	sent, retried := b.schedule(t, "acme", "sent", hour), b.schedule(t, "acme", "retried", hour)
	late, parked := b.schedule(t, "acme", "late", b.now.Add(time.Minute)), b.schedule(t, "acme", "parked", hour)
	fences := b.enqueue(t)

	rows, err := st.LoadForDelivery(ctx, []int64{sent, retried, late, parked})
	require.NoError(t, err)
	require.Len(t, rows, 4)
	require.Equal(t, "learner@example.com", rows[sent].Recipient, "a worker reads what it sends")
	require.Equal(t, "Go 101", rows[sent].Data["course"])

	atts, err := st.ClaimAttempts(ctx, b.now, []store.Fenced{fences[sent], fences[retried]}, time.Minute, login)
	require.NoError(t, err)
	require.Len(t, atts, 2)
	next := b.now.Add(30 * time.Second)
	recorded, err := st.RecordOutcomes(ctx, b.now, []store.Outcome{
		{ReminderID: sent, Fence: atts[sent].Fence, AttemptID: atts[sent].AttemptID, Code: reminder.CodeDelivered,
			Attempt: reminder.OutcomeDelivered, Reason: "delivered", ProviderID: "msg-1"},
		{ReminderID: retried, Fence: atts[retried].Fence, AttemptID: atts[retried].AttemptID, Code: reminder.CodeRetry,
			Attempt: reminder.OutcomeUnknown, NextAttemptAt: &next, Error: "503", Reason: "retry 1 in 30s: 503"},
	}, login)
	require.NoError(t, err)
	require.Len(t, recorded, 2)
	unknown, err := st.UnknownAttempts(ctx, []int64{sent, retried}, nil)
	require.NoError(t, err, "a worker reads the attempts it asks the provider about (schema version 17)")
	require.Len(t, unknown[retried], 1)
	require.Empty(t, unknown[sent])

	expired, err := st.ExpireFenced(ctx, b.now.Add(time.Minute), []store.Fenced{fences[late]}, login, "deadline reached")
	require.NoError(t, err)
	require.True(t, expired[late])
	quarantined, err := st.Quarantine(ctx, b.now, []store.Fenced{fences[parked]}, login, "unverifiable")
	require.NoError(t, err)
	require.True(t, quarantined[parked])
	noted, err := st.NoteEvents(ctx, b.now, reminder.CodeDeadLettered, []int64{parked, 987654321},
		[]string{"delivered 6 times without an outcome", "no such reminder"}, login)
	require.NoError(t, err, "a worker notes its dead letters in the timeline")
	require.EqualValues(t, 1, noted, "only existing reminders are noted")

	for id, want := range map[int64]reminder.State{sent: reminder.Delivered, retried: reminder.Retrying,
		late: reminder.Expired, parked: reminder.Quarantined} {
		require.Equal(t, want, b.state(t, id), "reminder %d", id)
	}
	var outcome, providerID string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT outcome, provider_message_id FROM delivery_attempts WHERE id = $1`,
		atts[sent].AttemptID).Scan(&outcome, &providerID))
	require.Equal(t, "delivered", outcome)
	require.Equal(t, "msg-1", providerID)

	for _, sql := range append(forbiddenToComponents,
		`UPDATE reminder_state SET enqueued_at = now()`,
		`UPDATE reminder_state SET republishes = 0`,
		`SELECT error FROM delivery_attempts WHERE false AND worker = ''`,
		`SELECT nudge_schedule('acme', 'k', 'email', 'a@example.com', 't', '{}', now(), now() + interval '1 hour')`,
	) {
		requireDenied(t, pool, sql)
	}
}

func TestReconcilerRoleRunsItsStatementsOnly(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	pool, login := b.login(t, "nudge_reconciler")
	st := store.New(pool)
	hour := b.now.Add(time.Hour)
	stuck, overdue := b.schedule(t, "acme", "stuck", hour), b.schedule(t, "acme", "overdue", b.now.Add(time.Minute))
	b.enqueue(t)
	// A dispatcher that died holding its lease.
	orphan := b.schedule(t, "acme", "orphan", hour)
	_, err := b.su.ClaimDue(ctx, b.now, b.now, 10, time.Minute, "dead-dispatcher")
	require.NoError(t, err)

	later := b.now.Add(15 * time.Minute)
	n, err := st.ExpireOverdue(ctx, later, 100, login)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	released, cleared, err := st.ResolveExpiredLeases(ctx, later, 100, login)
	require.NoError(t, err)
	require.Equal(t, [2]int{1, 1}, [2]int{released, cleared}, "the orphan returns to pending; stuck was confirmed")
	require.Equal(t, reminder.Pending, b.state(t, orphan))
	reclaimed, err := st.Reclaim(ctx, later, 10*time.Minute, 100, time.Minute, login)
	require.NoError(t, err)
	require.Len(t, reclaimed, 1)
	require.Equal(t, stuck, reclaimed[0].ID)
	require.NoError(t, st.ConfirmPublished(ctx, later, map[int64]int{reclaimed[0].Batch: 1}, login))
	// Release, the other half of republishing, on a lease it took again.
	reclaimed, err = st.Reclaim(ctx, later.Add(11*time.Minute), 10*time.Minute, 100, time.Minute, login)
	require.NoError(t, err)
	require.Len(t, reclaimed, 1)
	releasedIDs, err := st.Release(ctx, later, []store.Fenced{{ID: stuck, Fence: reclaimed[0].Fence}}, login, "publish not confirmed")
	require.NoError(t, err)
	require.True(t, releasedIDs[stuck])

	require.Equal(t, reminder.Expired, b.state(t, overdue))
	require.Equal(t, reminder.Pending, b.state(t, orphan))
	require.Equal(t, reminder.Pending, b.state(t, stuck))

	// Since schema version 24 it reads the recipient and the provider's
	// message id, to ask the provider about an attempt whose outcome was
	// unknown at the deadline (UnknownAtDeadline), but never the data.
	for _, sql := range []string{`SELECT provider_message_id, provider FROM delivery_attempts`, `SELECT recipient FROM reminders`} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	for _, sql := range append(forbiddenToComponents,
		`SELECT data FROM reminders`,
		`UPDATE reminder_state SET attempts = 0`,
		`SELECT nudge_cancel('acme', 'stuck')`,
	) {
		requireDenied(t, pool, sql)
	}
}

// runCtl runs nudgectl's real command tree against dbURL.
func runCtl(t *testing.T, dbURL string, args ...string) (string, error) {
	t.Helper()
	cmd := ctl.Command()
	cmd.SilenceUsage = true
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append(args, "--database-url", dbURL))
	err := cmd.Execute()
	if err != nil {
		err = fmt.Errorf("nudgectl %s: %w\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), err
}

func TestOperatorRoleRunsNudgectl(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	pool, _ := b.login(t, "nudge_operator")
	opURL := pool.Config().ConnString()
	other := b.schedule(t, "globex", "g", b.now.Add(time.Hour))

	out, err := runCtl(t, opURL, "schedule", "--tenant", "acme", "--key", "k1", "--channel", "sms",
		"--recipient", "+14155550100", "--template", "renewal", "--due-at", b.now.Format(time.RFC3339),
		"--deadline", b.now.Add(time.Hour).Format(time.RFC3339))
	require.NoError(t, err)
	require.Contains(t, out, "created")
	r, err := intake.GetByKey(ctx, pool, "acme", "k1")
	require.NoError(t, err)

	out, err = runCtl(t, opURL, "show", "--tenant", "globex", "--key", "g")
	require.NoError(t, err, "an operator sees every tenant")
	require.Contains(t, out, "globex")
	_, err = runCtl(t, opURL, "cancel", fmt.Sprint(r.ID), "--reason", "test")
	require.NoError(t, err)
	_, err = runCtl(t, opURL, "cancel", "--tenant", "globex", "--key", "g")
	require.NoError(t, err)
	out, err = runCtl(t, opURL, "stats")
	require.Equal(t, ctl.ExitUnhealthy, ctl.ExitCode(err), "it answers, with the privileges it needs (no dispatcher run yet: exit 6): %v", err)
	require.Contains(t, out, "canceled")
	require.Equal(t, reminder.Canceled, b.state(t, r.ID))
	require.Equal(t, reminder.Canceled, b.state(t, other))
	require.Equal(t, 0, count(t, pool, `SELECT 1 FROM delivery_attempts`), "attempts are readable")

	for _, sql := range []string{
		`DELETE FROM reminders`,
		`UPDATE reminders SET recipient = 'evil@example.com'`,
		`UPDATE reminders SET tenant = 'evil'`,
		`UPDATE reminders SET data = '{"evil": true}'`,
		`INSERT INTO reminder_state (id, tenant, channel, due_at, deadline, state)
		 VALUES (1, 'evil', 'email', now(), now() + interval '1 hour', 'delivered')`,
		`DELETE FROM reminder_events`,
		`UPDATE delivery_attempts SET outcome = 'delivered'`,
		`INSERT INTO nudge_intake_tenants VALUES ('someone', '*')`,
		`CREATE TABLE evil (x int)`,
	} {
		requireDenied(t, pool, sql)
	}
}

func TestIntakeRoleActsForItsTenantsOnly(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	acme, acmeLogin := b.login(t, "nudge_intake")
	b.grantTenant(t, acmeLogin, "acme")
	due, deadline := b.now, b.now.Add(time.Hour)
	sched := `SELECT nudge_schedule($1, $2, 'email', 'learner@example.com', 'course-expiry', '{}', $3, $4)`
	try := `SELECT status FROM nudge_try_schedule($1, $2, 'email', 'learner@example.com', 'course-expiry', '{}', $3, $4)`
	theirs := b.schedule(t, "globex", "theirs", deadline)

	var mine int64
	require.NoError(t, acme.QueryRow(ctx, sched, "acme", "mine", due, deadline).Scan(&mine))
	var status string
	require.NoError(t, acme.QueryRow(ctx, try, "acme", "mine", due, deadline).Scan(&status))
	require.Equal(t, "exists", status, "idempotent repeat through the checked function")
	require.NoError(t, acme.QueryRow(ctx, try, "", "x", due, deadline).Scan(&status))
	require.Equal(t, "invalid", status, "an empty tenant is a validation error, not a privilege one")
	requireDenied(t, acme, sched, "globex", "k", due, deadline)
	requireDenied(t, acme, try, "globex", "k", due, deadline)
	require.NoError(t, acme.QueryRow(ctx, `SELECT nudge_cancel('acme', 'nope')`).Scan(new(*string)),
		"canceling a missing key of its own tenant answers NULL")
	requireDenied(t, acme, `SELECT nudge_cancel('globex', 'theirs')`)
	requireDenied(t, acme, `SELECT nudge_cancel('globex', 'no-such-key')`)
	require.Equal(t, reminder.Pending, b.state(t, theirs))

	// Schema-qualified, from a session whose search_path lacks the schema.
	conn0, err := acme.Acquire(ctx)
	require.NoError(t, err)
	// Not back into the pool with its search_path (and released even if the test fails).
	defer func() { _ = conn0.Hijack().Close(ctx) }()
	_, err = conn0.Exec(ctx, `SET search_path = pg_catalog`)
	require.NoError(t, err)
	q := pgx.Identifier{b.db.Schema}.Sanitize()
	var qualified int64
	require.NoError(t, conn0.QueryRow(ctx, `SELECT `+q+`.nudge_schedule('acme', 'qualified', 'email', 'learner@example.com',
		'course-expiry', '{}', $1, $2)`, due, deadline).Scan(&qualified))

	// Reads: its own tenant's rows and their events, through pkg/intake too.
	require.Equal(t, 2, count(t, acme, `SELECT id FROM reminders`))
	r, err := intake.GetByKey(ctx, acme, "acme", "mine")
	require.NoError(t, err)
	require.Equal(t, mine, r.ID)
	_, err = intake.Get(ctx, acme, theirs)
	require.ErrorIs(t, err, intake.ErrNotFound, "another tenant's reminder does not exist for intake")
	_, err = intake.GetByKey(ctx, acme, "globex", "theirs")
	require.ErrorIs(t, err, intake.ErrNotFound)
	evs, err := intake.Events(ctx, acme, mine)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	evs, err = intake.Events(ctx, acme, theirs)
	require.NoError(t, err)
	require.Empty(t, evs, "another tenant's events are hidden")
	require.Equal(t, 0, count(t, acme, `SELECT 1 FROM reminder_events WHERE reminder_id = $1`, theirs))

	st, err := intake.Cancel(ctx, acme, "acme", "mine", "web", "learner unsubscribed")
	require.NoError(t, err)
	require.Equal(t, reminder.Canceled, st)

	// No direct writes, no attempts, no escalation.
	for _, sql := range []string{
		`UPDATE reminder_state SET state = 'pending'`,
		`UPDATE reminder_state SET state = 'canceled' WHERE tenant = 'globex'`,
		`DELETE FROM reminders`,
		`INSERT INTO reminders (tenant, key, channel, recipient, template, due_at, deadline, idempotency_key)
		 VALUES ('acme', 'direct', 'email', 'a@example.com', 't', now(), now() + interval '1 hour', 'x')`,
		`INSERT INTO reminder_events (reminder_id, to_state, fence, actor, at) VALUES (1, 'delivered', 0, 'x', now())`,
		`SELECT id FROM delivery_attempts`,
		`INSERT INTO nudge_intake_tenants VALUES (session_user, 'globex')`,
		`SELECT nudge_try_schedule_unchecked('globex', 'k', 'email', 'a@example.com', 't', '{}', now(), now() + interval '1 hour')`,
		`SELECT nudge_cancel_unchecked('globex', 'theirs')`,
		`CREATE TABLE evil (x int)`,
	} {
		requireDenied(t, acme, sql)
	}

	// nudge.tenant narrows a session; it never widens what the login is granted.
	conn, err := acme.Acquire(ctx)
	require.NoError(t, err)
	// Not back into the pool with its session tenant.
	defer func() { _ = conn.Hijack().Close(ctx) }()
	_, err = conn.Exec(ctx, `SET nudge.tenant = 'globex'`)
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM reminders`).Scan(&n))
	require.Zero(t, n, "the session tenant globex is not granted to this login, and acme is not the session tenant")
	_, err = conn.Exec(ctx, sched, "globex", "k", due, deadline)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code)
}

// A Go web tier links pkg/intake and connects as a login of nudge_intake:
// Schedule goes through nudge_try_schedule, so it works for the login's
// tenants, inside the application's transaction, with every status and
// error a caller handles, and is refused for another tenant.
func TestIntakeLoginSchedulesThroughPkgIntake(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	web, login := b.login(t, "nudge_intake")
	b.grantTenant(t, login, "acme")
	req := intake.Request{Tenant: "acme", Key: "renewal:1", Channel: reminder.Email, Recipient: "learner@example.com",
		Template: "course-expiry", Data: map[string]any{"course": "Go 101"}, DueAt: b.now.Add(time.Hour), Deadline: b.now.Add(2 * time.Hour)}

	res, err := intake.Schedule(ctx, web, req)
	require.NoError(t, err)
	require.Equal(t, intake.Created, res.Status)
	again, err := intake.Schedule(ctx, web, req)
	require.NoError(t, err)
	require.Equal(t, intake.Result{ID: res.ID, Status: intake.Exists}, again, "the same content again converges")
	changed := req
	changed.Recipient = "other@example.com"
	_, err = intake.Schedule(ctx, web, changed)
	var conflict *intake.ConflictError
	require.ErrorAs(t, err, &conflict)
	require.Equal(t, res.ID, conflict.ID)
	bad := req
	bad.Key, bad.Deadline = "renewal:bad", req.DueAt.Add(-time.Minute)
	_, err = intake.Schedule(ctx, web, bad)
	var verr *intake.ValidationError
	require.ErrorAs(t, err, &verr)
	require.Equal(t, "deadline", verr.Field)

	// Local time: 09:00 in the recipient's zone, sent on weekdays only.
	w, err := localtime.ParseWindow("mon-fri 08:00-21:00")
	require.NoError(t, err)
	local := intake.Request{Tenant: "acme", Key: "renewal:local", Channel: reminder.SMS, Recipient: "+14155550100",
		Template: "course-expiry", TZ: "Europe/Stockholm", DueLocal: "2027-03-29T09:00", DeadlineLocal: "2027-03-29T21:00", Window: &w}
	lres, err := intake.Schedule(ctx, web, local)
	require.NoError(t, err)
	r, err := intake.Get(ctx, web, lres.ID)
	require.NoError(t, err)
	require.True(t, r.DueAt.Equal(time.Date(2027, 3, 29, 7, 0, 0, 0, time.UTC)), "09:00 CEST is 07:00 UTC, got %s", r.DueAt)

	// Inside the application's transaction: rolled back, nothing is left.
	tx, err := web.Begin(ctx)
	require.NoError(t, err)
	inTx := req
	inTx.Key = "renewal:rolled-back"
	_, err = intake.Schedule(ctx, tx, inTx)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	_, err = intake.GetByKey(ctx, web, "acme", "renewal:rolled-back")
	require.ErrorIs(t, err, intake.ErrNotFound)

	// Another tenant: refused with 42501, nothing written.
	theirs := req
	theirs.Tenant = "globex"
	_, err = intake.Schedule(ctx, web, theirs)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code)
	require.Equal(t, 0, count(t, b.db.Pool, `SELECT id FROM reminders WHERE tenant = 'globex'`))
	require.Equal(t, 2, count(t, b.db.Pool, `SELECT id FROM reminders WHERE tenant = 'acme'`))

	// ScheduleMany writes the tables itself, which this login may not: its
	// error says what the login can call instead.
	many := req
	many.Key = "renewal:many"
	_, err = intake.ScheduleMany(ctx, web, []intake.Request{many})
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code)
	require.ErrorContains(t, err, "nudge_schedule_many")
}

func TestIntakeLoginForEveryTenantNarrowsPerTransaction(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	web, login := b.login(t, "nudge_intake")
	b.grantTenant(t, login, "*")
	b.schedule(t, "acme", "a", b.now.Add(time.Hour))
	b.schedule(t, "globex", "g", b.now.Add(time.Hour))
	require.Equal(t, 2, count(t, web, `SELECT id FROM reminders`), "'*' and no session tenant: every tenant")

	tx, err := web.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // after a failed statement
	_, err = tx.Exec(ctx, `SELECT set_config('nudge.tenant', 'acme', true)`)
	require.NoError(t, err)
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM reminders`).Scan(&n))
	require.Equal(t, 1, n, "scoped to acme for this transaction")
	var id int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT nudge_schedule('acme', 'a2', 'sms', '+14155550100', 'renewal', '{}', $1, $2)`,
		b.now, b.now.Add(time.Hour)).Scan(&id))
	_, err = tx.Exec(ctx, `SELECT nudge_cancel('globex', 'g')`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code, "outside the session tenant")
	require.Contains(t, pgErr.Error(), "may not act for tenant 'globex'")

	// A login with no tenant granted can do nothing.
	none, _ := b.login(t, "nudge_intake")
	require.Equal(t, 0, count(t, none, `SELECT id FROM reminders`))
	requireDenied(t, none, `SELECT nudge_schedule('acme', 'k', 'email', 'a@example.com', 't', '{}', now(), now() + interval '1 hour')`)
}

// The role creation in 0002 must survive a concurrent migration in another
// database of the same cluster (roles are cluster-wide; the migration lock is
// per database): a second CREATE ROLE of a name another transaction has just
// created waits for it and then fails with unique_violation, which the
// migration must absorb. This runs 0002's own DO block, with role names of
// this test's, against a creator holding its transaction open.
func TestRoleCreationToleratesAConcurrentCreator(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	block := roleCreationBlock(t)
	prefix := "nudge_t_" + testenv.RandomID() + "_"
	var names []string
	for _, r := range groupRoles {
		name := prefix + strings.TrimPrefix(r, "nudge_")
		block = strings.ReplaceAll(block, "'"+r+"'", "'"+name+"'")
		block = strings.ReplaceAll(block, r, name) // the GRANT USAGE list
		names = append(names, name)
	}
	require.NotContains(t, block, "nudge_intake", "every role name was replaced")
	t.Cleanup(func() {
		for _, n := range names {
			ident := pgx.Identifier{n}.Sanitize()
			_, _ = b.db.Pool.Exec(context.Background(), `DROP OWNED BY `+ident+`; DROP ROLE IF EXISTS `+ident)
		}
	})

	creator, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer creator.Rollback(ctx) //nolint:errcheck // committed below
	_, err = creator.Exec(ctx, `CREATE ROLE `+pgx.Identifier{names[2]}.Sanitize()+` NOLOGIN`)
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() {
		_, err := b.db.Pool.Exec(ctx, block)
		done <- err
	}()
	// The migration's CREATE ROLE of names[2] now waits on the creator.
	require.Eventually(t, func() bool {
		var waiting int
		_ = b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, prefix).Scan(&waiting)
		return waiting > 0
	}, 10*time.Second, 20*time.Millisecond, "the migration never waited for the concurrent creator")
	require.NoError(t, creator.Commit(ctx))
	select {
	case err := <-done:
		require.NoError(t, err, "the migration must absorb a role created concurrently")
	case <-time.After(10 * time.Second):
		t.Fatal("the migration did not finish after the concurrent creator committed")
	}
	var n int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname = ANY($1)`, names).Scan(&n))
	require.Equal(t, len(names), n)
}

// roleCreationBlock returns the DO block of 0002 that creates the roles.
func roleCreationBlock(t *testing.T) string {
	t.Helper()
	migs, err := schema.Migrations()
	require.NoError(t, err)
	for _, m := range migs {
		if m.Version != 2 {
			continue
		}
		start := strings.Index(m.SQL, "DO $$")
		end := strings.Index(m.SQL, "END $$;")
		require.True(t, start >= 0 && end > start, "0002 has no DO block")
		block := m.SQL[start : end+len("END $$;")]
		require.Contains(t, block, "CREATE ROLE")
		return block
	}
	t.Fatal("no migration 0002")
	return ""
}

func TestRetentionRoleCleansUpAndNothingElse(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	pool, _ := b.login(t, "nudge_retention")
	old := b.schedule(t, "acme", "old", b.now.Add(time.Hour))
	live := b.schedule(t, "acme", "live", b.now.Add(time.Hour))
	// Delivered on the happy path 40 days ago (past the reminder window, not
	// the events'): its claim, attempt and delivery folded into the row
	// (schema version 30), which retention keeps as events.
	_, err := b.db.Pool.Exec(ctx, `UPDATE reminder_state SET state = 'delivered', fence = 2,
		finished_at = now() - interval '40 days', claimed_at = now() - interval '41 days', claimed_fence = 1,
		claimed_by = 'd', started_at = now() - interval '41 days', started_fence = 2, started_by = 'w',
		delivered_by = 'w' WHERE id = $1`, old)
	require.NoError(t, err)

	sum, err := retention.New(pool, retention.Config{}, clock.Real{}).Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), sum.RemindersDeleted)
	require.Equal(t, 1, count(t, b.db.Pool, `SELECT 1 FROM reminders`))
	require.Equal(t, reminder.Pending, b.state(t, live))
	require.Equal(t, 3, count(t, b.db.Pool, `SELECT 1 FROM reminder_events WHERE reminder_id = $1
		AND code IN ('claimed', 'attempt_claimed', 'delivered')`, old), "the deleted row's folded events are kept")

	for _, sql := range []string{
		`UPDATE reminder_state SET state = 'delivered'`,
		`UPDATE reminders SET tenant = 'evil'`,
		`INSERT INTO reminder_events (reminder_id, to_state, fence, actor, at) VALUES (1, 'delivered', 0, 'x', now())`,
		// only a terminal row's folded events, not a forged one of a live row
		fmt.Sprintf(`INSERT INTO reminder_events (reminder_id, from_state, to_state, fence, actor, code, reason, at)
			VALUES (%d, 'sending', 'delivered', 0, 'x', 'delivered', 'x', now())`, live),
	} {
		requireDenied(t, pool, sql)
	}
}

// The heartbeat the dispatcher writes and the gauges the reconciler serves
// work under their roles (version 4 grants).
func TestDispatcherHeartbeatAndReconcilerGaugesUnderTheirRoles(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	b.schedule(t, "acme", "k", b.now.Add(time.Hour))
	disp, _ := b.login(t, "nudge_dispatcher")
	require.NoError(t, dispatch.RecordRun(ctx, disp, "d", dispatch.Summary{Cutoff: b.now}, b.now, nil))
	// A run that cannot publish expires what is late (issue 13, finding 7).
	late := b.now.Add(2 * time.Hour)
	expired, err := dispatch.ExpireDue(ctx, disp, late, late, 10, "d")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"email": 1}, expired)

	rec, _ := b.login(t, "nudge_reconciler")
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(&metrics.DBCollector{DB: rec, Clock: clock.Real{}}))
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if m.GetGauge() != nil {
				got[f.GetName()] += m.GetGauge().GetValue()
			}
		}
	}
	require.Contains(t, got, "nudge_oldest_due_age_seconds")
	for name, v := range got {
		if strings.Contains(name, "success") {
			require.Equal(t, 1.0, v, "the gauge query ran under the reconciler's grants")
		}
	}
}

// Regression (issue 13, finding 5): nudge_reschedule ran with the caller's
// rights and was executable by PUBLIC, so the intake role could not use it,
// and granting it the table would have let one tenant move another's
// reminders. Like nudge_cancel it now checks the tenant and runs as its owner.
func TestIntakeRoleReschedulesItsTenantsOnly(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	acme, acmeLogin := b.login(t, "nudge_intake")
	b.grantTenant(t, acmeLogin, "acme")
	deadline := b.now.Add(time.Hour)
	mine := b.schedule(t, "acme", "mine", deadline)
	theirs := b.schedule(t, "globex", "theirs", deadline)
	newDue, newDeadline := b.now.Add(2*time.Hour), b.now.Add(3*time.Hour)

	st, err := intake.Reschedule(ctx, acme, "acme", "mine", newDue, newDeadline, "web", "course moved")
	require.NoError(t, err, "intake reschedules its own tenant's reminder")
	require.Equal(t, reminder.Pending, st)
	r, err := intake.Get(ctx, b.db.Pool, mine)
	require.NoError(t, err)
	require.True(t, newDue.Equal(r.DueAt), "due_at moved")
	_, err = intake.Reschedule(ctx, acme, "acme", "nope", newDue, newDeadline, "web", "")
	require.ErrorIs(t, err, intake.ErrNotFound, "a missing key of its own tenant")

	resched := `SELECT nudge_reschedule($1, $2, $3, $4)`
	requireDenied(t, acme, resched, "globex", "theirs", newDue, newDeadline)
	requireDenied(t, acme, resched, "globex", "no-such-key", newDue, newDeadline)
	requireDenied(t, acme, `SELECT nudge_reschedule_unchecked($1, $2, $3, $4)`, "globex", "theirs", newDue, newDeadline)
	r, err = intake.Get(ctx, b.db.Pool, theirs)
	require.NoError(t, err)
	require.True(t, deadline.Equal(r.Deadline), "another tenant's reminder did not move")

	// Only intake and the operator may execute it (no PUBLIC execute).
	dispatcher, _ := b.login(t, "nudge_dispatcher")
	requireDenied(t, dispatcher, resched, "acme", "mine", newDue, newDeadline)
	var canExecute bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT has_function_privilege('public',
		'nudge_reschedule(text, text, timestamptz, timestamptz, text, text)', 'EXECUTE')`).Scan(&canExecute))
	require.False(t, canExecute, "PUBLIC may not execute nudge_reschedule")
}
