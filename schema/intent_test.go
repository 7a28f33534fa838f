package schema_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// Issue 14: the web tier changes its intent (new times, new content, cancel
// by key prefix) from its own transaction, as the intake role, for its own
// tenants only, and every case is an answer rather than an error.
func TestIntakeRoleChangesItsTenantsIntentOnly(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	acme, acmeLogin := b.login(t, "nudge_intake")
	b.grantTenant(t, acmeLogin, "acme")
	deadline := b.now.Add(time.Hour)
	course := b.schedule(t, "acme", "course-expiry:learner-42:course-7", deadline)
	other := b.schedule(t, "acme", "course-expiry:learner-42:course-8", deadline)
	learner43 := b.schedule(t, "acme", "course-expiry:learner-43:course-7", deadline)
	theirs := b.schedule(t, "globex", "course-expiry:learner-42:course-7", deadline)
	newDue, newDeadline := b.now.Add(2*time.Hour), b.now.Add(3*time.Hour)
	content := intake.Content{Recipient: "ada@example.org", Data: map[string]any{"course": "Go 102"}}

	// In one transaction of the web tier, with a business change beside it.
	tx, err := acme.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // after commit
	c, err := intake.RescheduleTo(ctx, tx, "acme", "course-expiry:learner-42:course-7", newDue, newDeadline, "web", "course moved")
	require.NoError(t, err)
	require.Equal(t, intake.Change{ID: course, Key: "course-expiry:learner-42:course-7", Status: intake.Changed,
		State: reminder.Pending}, c)
	c, err = intake.RescheduleTo(ctx, tx, "acme", "course-expiry:learner-42:course-7", newDue, newDeadline, "web", "again")
	require.NoError(t, err)
	require.Equal(t, intake.Unchanged, c.Status, "the same times again change nothing")
	c, err = intake.Update(ctx, tx, "acme", "course-expiry:learner-42:course-7", content, "web", "new address")
	require.NoError(t, err)
	require.Equal(t, intake.Changed, c.Status)
	c, err = intake.Update(ctx, tx, "acme", "course-expiry:learner-42:course-7", content, "web", "again")
	require.NoError(t, err)
	require.Equal(t, intake.Unchanged, c.Status, "the same content again changes nothing")
	c, err = intake.Update(ctx, tx, "acme", "no-such-key", content, "web", "")
	require.NoError(t, err)
	require.Equal(t, intake.Change{Key: "no-such-key", Status: intake.NotFound}, c)
	require.NoError(t, tx.Commit(ctx))

	r, err := intake.Get(ctx, acme, course)
	require.NoError(t, err)
	require.Equal(t, "ada@example.org", r.Recipient)
	require.Equal(t, "course-expiry", r.Template, "a field not given is kept")
	require.JSONEq(t, `{"course": "Go 102"}`, string(r.Data))
	require.True(t, newDue.Equal(r.DueAt), "the update kept the rescheduled times")
	evs, err := intake.Events(ctx, acme, course)
	require.NoError(t, err)
	var codes []reminder.Code
	for _, e := range evs {
		codes = append(codes, e.Code)
	}
	require.Equal(t, []reminder.Code{reminder.CodeScheduled, reminder.CodeRescheduled, reminder.CodeUpdated}, codes,
		"one event per change, none for the repeats")

	// A send in flight is too late to change; a dry run counts it apart.
	// (As ClaimForDelivery, the only way into sending, leaves it: under a
	// send lease. Schema version 27 finds sending rows among the leases.)
	_, err = b.db.Pool.Exec(ctx, `UPDATE reminder_state SET state = 'sending', lease_until = $2 WHERE id = $1`,
		other, b.now.Add(time.Minute))
	require.NoError(t, err)
	n, err := intake.CountPrefix(ctx, acme, "acme", "course-expiry:learner-42:")
	require.NoError(t, err)
	require.Equal(t, intake.PrefixCount{Open: 1, Sending: 1}, n)
	c, err = intake.Update(ctx, acme, "acme", "course-expiry:learner-42:course-8", content, "web", "")
	require.NoError(t, err)
	require.Equal(t, intake.Change{ID: other, Key: "course-expiry:learner-42:course-8", Status: intake.AlreadySending,
		State: reminder.Sending}, c)

	// Eligibility ends: every reminder of learner 42, not learner 43's, not globex's.
	cs, err := intake.CancelPrefix(ctx, acme, "acme", "course-expiry:learner-42:", 100, "web", "eligibility ended")
	require.NoError(t, err)
	require.Equal(t, []intake.Change{
		{ID: course, Key: "course-expiry:learner-42:course-7", Status: intake.Changed, State: reminder.Canceled},
		{ID: other, Key: "course-expiry:learner-42:course-8", Status: intake.AlreadySending, State: reminder.Sending},
	}, cs)
	require.Equal(t, reminder.Canceled, b.state(t, course))
	require.Equal(t, reminder.Pending, b.state(t, learner43))
	require.Equal(t, reminder.Pending, b.state(t, theirs))
	cs, err = intake.CancelPrefix(ctx, acme, "acme", "course-expiry:learner-42:", 100, "web", "again")
	require.NoError(t, err)
	require.Equal(t, []intake.Change{{ID: other, Key: "course-expiry:learner-42:course-8", Status: intake.AlreadySending,
		State: reminder.Sending}}, cs, "ended reminders are left out")

	// Ended: an answer, not an error.
	c, err = intake.Update(ctx, acme, "acme", "course-expiry:learner-42:course-7", intake.Content{Template: "renewal"}, "web", "")
	require.NoError(t, err)
	require.Equal(t, intake.Change{ID: course, Key: "course-expiry:learner-42:course-7", Status: intake.AlreadyTerminal,
		State: reminder.Canceled}, c)
	c, err = intake.RescheduleTo(ctx, acme, "acme", "course-expiry:learner-42:course-7", b.now, deadline, "web", "")
	require.NoError(t, err)
	require.Equal(t, intake.AlreadyTerminal, c.Status)

	// Another tenant's: refused, whether or not the key exists, and nothing moved.
	for _, key := range []string{"course-expiry:learner-42:course-7", "no-such-key"} {
		requireDenied(t, acme, `SELECT * FROM nudge_update('globex', $1, 'evil@example.com', NULL, NULL)`, key)
		requireDenied(t, acme, `SELECT * FROM nudge_reschedule_to('globex', $1, $2, $3)`, key, newDue, newDeadline)
	}
	requireDenied(t, acme, `SELECT * FROM nudge_cancel_prefix('globex', 'course-expiry:', 100)`)
	n, err = intake.CountPrefix(ctx, acme, "globex", "course-expiry:")
	require.NoError(t, err)
	require.Zero(t, n, "another tenant's reminders are not even counted")
	r, err = intake.Get(ctx, b.db.Pool, theirs)
	require.NoError(t, err)
	require.Equal(t, reminder.Pending, r.State)
	require.Equal(t, "learner@example.com", r.Recipient)
	require.True(t, deadline.Equal(r.Deadline))

	// Only intake and the operator may execute them.
	dispatcher, _ := b.login(t, "nudge_dispatcher")
	requireDenied(t, dispatcher, `SELECT * FROM nudge_cancel_prefix('acme', 'course-expiry:', 100)`)
	requireDenied(t, dispatcher, `SELECT * FROM nudge_update('acme', 'x', NULL, NULL, NULL)`)
	requireDenied(t, dispatcher, `SELECT * FROM nudge_reschedule_to('acme', 'x', now(), now() + interval '1 hour')`)
}

// A key prefix is matched exactly: LIKE's wildcards in it are plain
// characters, and an empty prefix or an unbounded limit is refused.
func TestCancelPrefixMatchesThePrefixLiterally(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	ctx := context.Background()
	deadline := b.now.Add(time.Hour)
	for _, key := range []string{"a_b:1", "axb:1", "a%:1", "az:1", `a\:1`, `a\b:1`} {
		b.schedule(t, "acme", key, deadline)
	}
	canceled := func(prefix string) []string {
		t.Helper()
		cs, err := intake.CancelPrefix(ctx, b.db.Pool, "acme", prefix, 100, "test", "")
		require.NoError(t, err)
		var keys []string
		for _, c := range cs {
			keys = append(keys, c.Key)
		}
		return keys
	}
	require.Equal(t, []string{"a_b:1"}, canceled("a_"))
	require.Equal(t, []string{"a%:1"}, canceled("a%"))
	require.Equal(t, []string{`a\:1`}, canceled(`a\:`))
	require.Equal(t, []string{`a\b:1`}, canceled(`a\`))
	require.Equal(t, []string{"axb:1", "az:1"}, canceled("a"))

	for _, bad := range []struct {
		prefix string
		limit  int
		field  string
	}{{"", 1, "key_prefix"}, {"a", 0, "limit"}, {"a", intake.MaxCancelPrefix + 1, "limit"}} {
		_, err := intake.CancelPrefix(ctx, b.db.Pool, "acme", bad.prefix, bad.limit, "test", "")
		var verr *intake.ValidationError
		require.ErrorAs(t, err, &verr)
		require.Equal(t, bad.field, verr.Field)
		// The SQL function refuses them too, for callers in other languages.
		_, err = b.db.Pool.Exec(ctx, `SELECT * FROM nudge_cancel_prefix('acme', $1, $2)`, bad.prefix, bad.limit)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "22023", pgErr.Code)
	}
}

// Every SECURITY DEFINER function runs with this schema's search_path
// pinned and is not executable by PUBLIC: a later migration adding one
// cannot forget either.
func TestSecurityDefinerFunctionsArePinnedAndPrivate(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	rows, err := b.db.Pool.Query(context.Background(), `
		SELECT p.oid::regprocedure::text, coalesce(array_to_string(p.proconfig, ','), ''),
		       has_function_privilege('public', p.oid, 'EXECUTE')
		  FROM pg_proc p
		 WHERE p.pronamespace = $1::regnamespace AND p.prosecdef
		 ORDER BY 1`, b.db.Schema)
	require.NoError(t, err)
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var (
			name, config string
			public       bool
		)
		require.NoError(t, rows.Scan(&name, &config, &public))
		require.Equal(t, "search_path="+b.db.Schema+", pg_temp", config, "%s: search_path not pinned", name)
		require.False(t, public, "%s: PUBLIC may execute it", name)
		seen++
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, seen, 7, "the intake functions are SECURITY DEFINER")
}
