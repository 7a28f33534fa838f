package campaign_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
)

func TestPlansInCheckpointedSlicesAndDropsDuplicates(t *testing.T) {
	t.Parallel()
	b := setup(t, 450)
	ctx := context.Background()
	id := b.create(t, "renewals-2027", 200)
	again, created, err := campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "acme", Name: "renewals-2027",
		Channel: "sms", Template: "other", Source: "renewals", DueAt: &b.now, Deadline: b.now.Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, id, again, "creating the same campaign twice returns the first")
	require.False(t, created)

	p := b.newPlanner("p1")
	cmd := campaign.Command{ID: id, Tenant: "acme"}
	for fence, want := range []campaign.Verdict{campaign.PlanSlice, campaign.Drop, campaign.PlanSlice, campaign.PlanSlice} {
		if fence > 1 {
			cmd.Fence = int64(fence - 1)
		}
		d, err := p.Step(ctx, cmd)
		require.NoError(t, err)
		require.Equal(t, want, d.Verdict, "step %d: %s", fence, d.Reason)
	}
	d, err := p.Step(ctx, campaign.Command{ID: id, Fence: 3})
	require.NoError(t, err)
	require.Equal(t, campaign.Drop, d.Verdict, "a done campaign plans nothing: %s", d.Reason)

	s, err := campaign.Get(ctx, b.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, campaign.Done, s.State)
	require.Equal(t, int64(450), s.Planned)
	require.Equal(t, int64(3), s.Slices)
	require.Equal(t, int64(450), b.count(t, `SELECT count(DISTINCT key) FROM reminders WHERE key LIKE $1`,
		fmt.Sprintf("campaign:%d:%%", id)))
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM campaign_slices a JOIN campaign_slices b
		ON a.campaign_id = b.campaign_id AND b.slice = a.slice + 1 WHERE a.cursor_to IS DISTINCT FROM b.cursor_from`),
		"each slice starts where the one before ended")
	require.Equal(t, int64(200), b.count(t, `SELECT cursor_to::bigint FROM campaign_slices WHERE slice = 1`),
		"keyset in the key's own order (as text, 279 would end the first 200)")
	require.Equal(t, int64(450), b.count(t, `SELECT sum(rows_read) FROM campaign_slices WHERE campaign_id = $1`, id))
	require.Equal(t, 2, b.queued(t), "a continuation per slice but the last, none for the duplicate")
}

func TestBadRowsAreRecordedAndTheRestPlanned(t *testing.T) {
	t.Parallel()
	b := setup(t, 5)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `
		UPDATE renewals SET email = NULL WHERE learner_id = 2;
		UPDATE renewals SET email = 'not an address' WHERE learner_id = 3;
		UPDATE renewals SET expires_on = NULL WHERE learner_id = 4`)
	require.NoError(t, err)
	days := 7
	id, _, err := campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "acme", Name: "week-before",
		Channel: "email", Template: "renewal", Source: "renewals", DaysBefore: &days,
		Deadline: time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC)})
	require.NoError(t, err)
	d, err := b.newPlanner("p1").Step(ctx, campaign.Command{ID: id})
	require.NoError(t, err)
	require.Equal(t, campaign.PlanSlice, d.Verdict)

	s, err := campaign.Get(ctx, b.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, campaign.Done, s.State)
	require.Equal(t, int64(2), s.Planned)
	require.Equal(t, int64(3), s.Bad)
	rows, err := b.db.Pool.Query(ctx, `SELECT audience_key, reason FROM campaign_bad_rows WHERE campaign_id = $1 ORDER BY 1`, id)
	require.NoError(t, err)
	var got []string
	for rows.Next() {
		var k, r string
		require.NoError(t, rows.Scan(&k, &r))
		got = append(got, k+": "+r)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, 3)
	require.Contains(t, got[0], `2: field "recipient"`)
	require.Contains(t, got[1], `3: field "recipient"`)
	require.Equal(t, "4: the date column is empty", got[2])
	var due, deadline time.Time
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT due_at, deadline FROM reminders WHERE key = $1`,
		fmt.Sprintf("campaign:%d:1", id)).Scan(&due, &deadline))
	require.True(t, due.Equal(time.Date(2027, 1, 24, 0, 0, 0, 0, time.UTC)), "seven days before, got %s", due)
	require.True(t, deadline.Equal(time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)), "the recipient's own date, got %s", deadline)
}

func TestADeadlinePassingMidPlanEndsLateWithTheRemainderCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, 500)
	ctx := context.Background()
	id := b.create(t, "too-slow", 200)
	p := b.newPlanner("p1")
	_, err := p.Step(ctx, campaign.Command{ID: id})
	require.NoError(t, err)
	b.clock.Advance(48 * time.Hour)
	d, err := p.Step(ctx, campaign.Command{ID: id, Fence: 1})
	require.NoError(t, err)
	require.Equal(t, campaign.EndLate, d.Verdict)
	s, err := campaign.Get(ctx, b.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, campaign.Late, s.State)
	require.Equal(t, int64(200), s.Planned)
	require.NotNil(t, s.Unplanned)
	require.Equal(t, int64(300), *s.Unplanned)
}

func TestALostContinuationIsRepublishedAfterALease(t *testing.T) {
	t.Parallel()
	b := setup(t, 500)
	ctx := context.Background()
	id := b.create(t, "lost", 200)
	p := b.newPlanner("p1")
	_, err := p.Step(ctx, campaign.Command{ID: id})
	require.NoError(t, err)
	// As if the planner died between its commit and its publish.
	_, err = b.db.Pool.Exec(ctx, `UPDATE campaigns SET continued = 0, updated_at = $2 WHERE id = $1`, id, b.now)
	require.NoError(t, err)
	d, err := p.Step(ctx, campaign.Command{ID: id})
	require.NoError(t, err)
	require.Equal(t, campaign.Drop, d.Verdict, "within the lease the committer may still publish: %s", d.Reason)
	b.clock.Advance(30 * time.Second)
	d, err = p.Step(ctx, campaign.Command{ID: id})
	require.NoError(t, err)
	require.Equal(t, campaign.Republish, d.Verdict)
	require.Equal(t, 2, b.queued(t))
	d, err = p.Step(ctx, campaign.Command{ID: id})
	require.NoError(t, err)
	require.Equal(t, campaign.Drop, d.Verdict, "republished once: %s", d.Reason)
}

func TestIntakeManagesItsTenantsCampaignsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, 10)
	ctx := context.Background()
	web, login, _ := b.login(t, "nudge_intake")
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO nudge_intake_tenants VALUES ($1, 'acme')`, login)
	require.NoError(t, err)
	spec := campaign.Spec{Tenant: "acme", Name: "c1", Channel: "email", Template: "renewal", Source: "renewals",
		DueAt: &b.now, Deadline: b.now.Add(time.Hour)}
	id, created, err := campaign.Create(ctx, web, spec)
	require.NoError(t, err)
	require.True(t, created)

	st, err := campaign.Set(ctx, web, "acme", id, campaign.Pause)
	require.NoError(t, err)
	require.Equal(t, campaign.Paused, st)
	d, err := b.newPlanner("p1").Step(ctx, campaign.Command{ID: id})
	require.NoError(t, err)
	require.Equal(t, campaign.Drop, d.Verdict, "a paused campaign plans nothing")
	st, err = campaign.Set(ctx, web, "acme", id, campaign.Resume)
	require.NoError(t, err)
	require.Equal(t, campaign.Planning, st)
	st, err = campaign.Set(ctx, web, "acme", id, campaign.Resume)
	require.NoError(t, err)
	require.Equal(t, campaign.Planning, st, "resuming a planning campaign is an answer, not an error")

	other := spec
	other.Tenant = "globex"
	_, _, err = campaign.Create(ctx, web, other)
	require.ErrorContains(t, err, "may not act for tenant")
	_, err = campaign.Set(ctx, web, "globex", id, campaign.Cancel)
	require.ErrorContains(t, err, "may not act for tenant")
	_, err = campaign.Set(ctx, b.db.Pool, "globex", id, campaign.Cancel)
	require.ErrorIs(t, err, campaign.ErrNotFound, "another tenant's campaign is not found")
	_, _, err = campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "globex", Name: "c1", Channel: "email",
		Template: "renewal", Source: "renewals", DueAt: &b.now, Deadline: b.now.Add(time.Hour)})
	require.ErrorContains(t, err, "names no audience source", "a source is registered for one tenant")

	st, err = campaign.Set(ctx, web, "acme", id, campaign.Cancel)
	require.NoError(t, err)
	require.Equal(t, campaign.Canceled, st)
	var n int
	require.NoError(t, web.QueryRow(ctx, `SELECT count(*) FROM campaigns`).Scan(&n))
	require.Equal(t, 1, n)
	_, err = web.Exec(ctx, `UPDATE campaigns SET state = 'planning'`)
	require.ErrorContains(t, err, "permission denied", "intake writes only through the functions")
}

// nudge_planner writes a campaign's progress only, and reads only the
// audiences granted to it; a source it could not read is refused at
// registration.
func TestPlannerRoleIsLeastPrivilege(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx := context.Background()
	id := b.create(t, "c", 10)
	for _, sql := range []string{
		`UPDATE campaigns SET tenant = 'globex'`,
		`UPDATE campaigns SET source = 'other'`,
		`DELETE FROM campaign_slices`,
		`INSERT INTO campaign_sources VALUES ('x', 'acme', 'renewals', 'learner_id', 'email', NULL, NULL)`,
		`SELECT nudge_campaign_source('x', 'acme', 'renewals', 'learner_id', 'email', NULL, NULL)`,
		`UPDATE reminder_state SET state = 'canceled'`,
		`SELECT * FROM nudge_campaign_set('acme', 1, 'cancel')`,
	} {
		_, err := b.planner.Exec(ctx, sql)
		require.ErrorContains(t, err, "permission denied", sql)
	}
	_, err := b.planner.Exec(ctx, `UPDATE campaigns SET updated_at = now() WHERE id = $1`, id)
	require.NoError(t, err, "its progress columns it may write")

	_, err = b.db.Pool.Exec(ctx, `CREATE TABLE secrets (id bigint PRIMARY KEY, email text)`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `SELECT nudge_campaign_source('secrets', 'acme', 'secrets', 'id', 'email', NULL, NULL)`)
	require.ErrorContains(t, err, "nudge_planner may not read")
	_, err = b.db.Pool.Exec(ctx, `SELECT nudge_campaign_source('typo', 'acme', 'renewals', 'learner', 'email', NULL, NULL)`)
	require.ErrorContains(t, err, "has no column")
}
