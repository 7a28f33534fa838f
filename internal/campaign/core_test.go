package campaign_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/pkg/localtime"
)

// planAll steps campaign id from its current fence until its chain ends,
// as the queue would, and returns the number of slices planned.
func (b *bundle) planAll(t *testing.T, p *campaign.Planner, id int64) int {
	t.Helper()
	slices := 0
	for fence := b.count(t, `SELECT fence FROM campaigns WHERE id = $1`, id); slices < 1000; fence++ {
		d, err := p.Step(context.Background(), campaign.Command{ID: id, Fence: fence})
		require.NoError(t, err)
		if d.Verdict != campaign.PlanSlice {
			return slices
		}
		slices++
		s, err := campaign.Get(context.Background(), b.db.Pool, id)
		require.NoError(t, err)
		if s.State != campaign.Planning {
			return slices
		}
	}
	t.Fatal("campaign never finished")
	return 0
}

type planned struct {
	due, deadline time.Time
	tz            string
}

func (b *bundle) reminders(t *testing.T, id int64) map[string]planned {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `
		SELECT split_part(key, ':', 3), due_at, deadline, coalesce(tz, '') FROM reminders WHERE key LIKE $1`,
		fmt.Sprintf("campaign:%d:%%", id))
	require.NoError(t, err)
	out := map[string]planned{}
	for rows.Next() {
		var k string
		var p planned
		require.NoError(t, rows.Scan(&k, &p.due, &p.deadline, &p.tz))
		out[k] = p
	}
	require.NoError(t, rows.Err())
	return out
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// A due rule in each recipient's local time: the zone column, the
// campaign's default zone for rows without one, spring-forward gaps and a
// fall-back overlap resolved as pkg/localtime defines them.
func TestLocalTimeDueRulesAcrossZones(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `
		CREATE TABLE people (id bigint PRIMARY KEY, email text, expires_on date, tz text);
		GRANT SELECT ON people TO nudge_planner;
		INSERT INTO people VALUES
			(1, 'stockholm@example.org', '2027-04-04', 'Europe/Stockholm'),  -- 7 days before: 2027-03-28, clocks jump 02:00 -> 03:00
			(2, 'newyork@example.org',   '2027-03-21', 'America/New_York'),  -- 2027-03-14, clocks jump 02:00 -> 03:00
			(3, 'tokyo@example.org',     '2027-03-08', 'Asia/Tokyo'),        -- no DST
			(4, 'nozone@example.org',    '2027-02-08', NULL),                -- the default zone
			(5, 'mars@example.org',      '2027-02-08', 'Mars/Olympus_Mons'),
			(6, 'autumn@example.org',    '2027-11-07', 'Europe/Stockholm'),  -- 2027-10-31, 02:30 happens twice
			(7, 'empty@example.org',     '2027-02-08', '');
		SELECT nudge_campaign_source('people', 'acme', 'people', 'id', 'email', NULL, 'expires_on', 'tz')`)
	require.NoError(t, err)
	p := b.newPlanner("p1")

	days := 7
	at := localtime.Clock(2, 30)
	id, _, err := campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "acme", Name: "week-before-0230",
		Channel: "email", Template: "renewal", Source: "people", DaysBefore: &days, AtLocal: &at,
		DefaultZone: "Europe/London", Deadline: utc("2028-01-01T00:00:00Z")})
	require.NoError(t, err)
	b.planAll(t, p, id)
	got := b.reminders(t, id)
	want := map[string]planned{
		// In the gap: forward by the gap, 03:30 CEST.
		"1": {utc("2027-03-28T01:30:00Z"), utc("2027-04-03T22:00:00Z"), "Europe/Stockholm"},
		// In the gap: 03:30 EDT.
		"2": {utc("2027-03-14T07:30:00Z"), utc("2027-03-21T04:00:00Z"), "America/New_York"},
		"3": {utc("2027-02-28T17:30:00Z"), utc("2027-03-07T15:00:00Z"), "Asia/Tokyo"},
		"4": {utc("2027-02-01T02:30:00Z"), utc("2027-02-08T00:00:00Z"), "Europe/London"},
		// In the overlap: the earlier instant, 02:30 CEST.
		"6": {utc("2027-10-31T00:30:00Z"), utc("2027-11-06T23:00:00Z"), "Europe/Stockholm"},
		"7": {utc("2027-02-01T02:30:00Z"), utc("2027-02-08T00:00:00Z"), "Europe/London"},
	}
	require.Len(t, got, len(want))
	for k, w := range want {
		require.True(t, got[k].due.Equal(w.due), "row %s due %s, want %s", k, got[k].due.UTC(), w.due)
		require.True(t, got[k].deadline.Equal(w.deadline), "row %s deadline %s, want %s", k, got[k].deadline.UTC(), w.deadline)
		require.Equal(t, w.tz, got[k].tz, "row %s", k)
	}
	var reason string
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT reason FROM campaign_bad_rows WHERE campaign_id = $1 AND audience_key = '5'`,
		id).Scan(&reason))
	require.Contains(t, reason, `field "zone"`)
	require.Contains(t, reason, "Mars/Olympus_Mons")

	// One wall-clock time everywhere: 2027-03-28 02:30 in each zone.
	wall, err := localtime.ParseWall("2027-03-28T02:30")
	require.NoError(t, err)
	id, _, err = campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "acme", Name: "same-wall-time",
		Channel: "email", Template: "renewal", Source: "people", DueLocal: &wall, DefaultZone: "Europe/London",
		Deadline: utc("2027-06-01T00:00:00Z")})
	require.NoError(t, err)
	b.planAll(t, p, id)
	got = b.reminders(t, id)
	for k, w := range map[string]time.Time{
		"1": utc("2027-03-28T01:30:00Z"), // Stockholm: in the gap, 03:30 CEST
		"2": utc("2027-03-28T06:30:00Z"), // New York: EDT since the 14th
		"3": utc("2027-03-27T17:30:00Z"), // Tokyo
		"4": utc("2027-03-28T01:30:00Z"), // London: 02:30 BST, an hour after the jump
		"6": utc("2027-03-28T01:30:00Z"),
		"7": utc("2027-03-28T01:30:00Z"),
	} {
		require.True(t, got[k].due.Equal(w), "row %s due %s, want %s", k, got[k].due.UTC(), w)
		require.True(t, got[k].deadline.Equal(utc("2027-06-01T00:00:00Z")), "row %s: the campaign's deadline", k)
	}
	require.Len(t, got, 6, "the row with an unknown zone is a bad row again")

	_, _, err = campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "acme", Name: "bad-zone", Channel: "email",
		Template: "renewal", Source: "people", DueLocal: &wall, DefaultZone: "CET", Deadline: utc("2027-06-01T00:00:00Z")})
	require.ErrorContains(t, err, `field "default_zone" must be an IANA time zone name`)
	_, _, err = campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "acme", Name: "two-rules", Channel: "email",
		Template: "renewal", Source: "people", DueLocal: &wall, DaysBefore: &days, Deadline: utc("2027-06-01T00:00:00Z")})
	require.ErrorContains(t, err, "exactly one due rule")
}

// A shadow campaign records what it would plan, slice by slice, and creates
// no reminder; a real run over the same audience plans the same counts.
func TestShadowCountsEqualARealRunPerSlice(t *testing.T) {
	t.Parallel()
	b := setup(t, 450)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `
		UPDATE renewals SET email = NULL WHERE learner_id % 17 = 0;
		UPDATE renewals SET email = 'not an address' WHERE learner_id % 29 = 0`)
	require.NoError(t, err)
	due := b.now.Add(time.Hour)
	spec := campaign.Spec{Tenant: "acme", Channel: "email", Template: "renewal", Source: "renewals", DueAt: &due,
		Deadline: b.now.Add(48 * time.Hour), SliceSize: 100}
	shadowSpec := spec
	shadowSpec.Name, shadowSpec.Shadow, shadowSpec.ShadowKeys = "preview", true, true
	shadow, _, err := campaign.Create(ctx, b.db.Pool, shadowSpec)
	require.NoError(t, err)
	spec.Name = "real"
	real, _, err := campaign.Create(ctx, b.db.Pool, spec)
	require.NoError(t, err)
	p := b.newPlanner("p1")
	require.Equal(t, 5, b.planAll(t, p, shadow))
	require.Equal(t, 5, b.planAll(t, p, real))

	cmp, err := campaign.CompareShadow(ctx, b.db.Pool, shadow, real)
	require.NoError(t, err)
	require.Len(t, cmp, 5)
	for _, c := range cmp {
		require.True(t, c.Same, "slice %d: shadow %d/%d/%d, real %d/%d/%d", c.Slice, *c.ShadowRows, *c.ShadowIntents,
			*c.ShadowBad, *c.RealRows, *c.RealIntents, *c.RealBad)
	}
	require.Equal(t, 100, *cmp[0].ShadowRows)
	bad := 450/17 + 450/29 - 450/(17*29)
	require.Equal(t, int64(450-bad), b.count(t, `SELECT sum(shadow_intents) FROM nudge_campaign_shadow_compare($1, $2)`, shadow, real))
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM reminders WHERE key LIKE $1`, fmt.Sprintf("campaign:%d:%%", shadow)),
		"a shadow campaign leaves no reminder to send")
	require.Equal(t, int64(450-bad), b.count(t, `SELECT count(*) FROM reminders WHERE key LIKE $1`, fmt.Sprintf("campaign:%d:%%", real)))
	require.Equal(t, int64(0), b.count(t, `
		SELECT count(*) FROM (SELECT audience_key FROM campaign_shadow_keys WHERE campaign_id = $1
		                      EXCEPT SELECT split_part(key, ':', 3) FROM reminders WHERE key LIKE $2) x`,
		shadow, fmt.Sprintf("campaign:%d:%%", real)), "the shadow keys are the keys the real run planned")
	require.Equal(t, int64(450-bad), b.count(t, `SELECT count(*) FROM campaign_shadow_keys WHERE campaign_id = $1`, shadow))
	s, err := campaign.Get(ctx, b.db.Pool, shadow)
	require.NoError(t, err)
	require.Equal(t, campaign.Done, s.State)
	require.Equal(t, int64(bad), s.Bad)

	// A run that differs shows where.
	_, err = b.db.Pool.Exec(ctx, `UPDATE renewals SET email = NULL WHERE learner_id = 250`)
	require.NoError(t, err)
	spec.Name = "changed"
	changed, _, err := campaign.Create(ctx, b.db.Pool, spec)
	require.NoError(t, err)
	b.planAll(t, p, changed)
	cmp, err = campaign.CompareShadow(ctx, b.db.Pool, shadow, changed)
	require.NoError(t, err)
	for _, c := range cmp {
		require.Equal(t, c.Slice != 3, c.Same, "slice %d", c.Slice)
	}
}

// The cohort: only the tenants in it may create and plan campaigns; a
// campaign of a tenant that leaves it waits, and goes on when it is back.
func TestCohortEnablesCampaignsForChosenTenants(t *testing.T) {
	t.Parallel()
	b := setup(t, 300)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `
		CREATE TABLE globex_people (id bigint PRIMARY KEY, email text);
		GRANT SELECT ON globex_people TO nudge_planner;
		SELECT nudge_campaign_source('globex-people', 'globex', 'globex_people', 'id', 'email', NULL, NULL)`)
	require.NoError(t, err)
	require.NoError(t, campaign.SetCohort(ctx, b.db.Pool, []string{"acme"}, "test"))
	cohort, err := campaign.Cohort(ctx, b.db.Pool)
	require.NoError(t, err)
	require.Equal(t, []string{"acme"}, cohort)

	_, _, err = campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "globex", Name: "g", Channel: "email",
		Template: "renewal", Source: "globex-people", DueAt: &b.now, Deadline: b.now.Add(time.Hour)})
	require.ErrorContains(t, err, `tenant 'globex' is not in the campaign cohort`)
	id := b.create(t, "acme-first", 100)
	p := b.newPlanner("p1")
	d, err := p.Step(ctx, campaign.Command{ID: id})
	require.NoError(t, err)
	require.Equal(t, campaign.PlanSlice, d.Verdict)

	require.NoError(t, campaign.ChangeCohort(ctx, b.db.Pool, []string{"acme"}, false, "test"))
	d, err = p.Step(ctx, campaign.Command{ID: id, Fence: 1})
	require.NoError(t, err)
	require.Equal(t, campaign.Drop, d.Verdict, "outside the cohort the campaign waits")
	require.Contains(t, d.Reason, "cohort")
	n, err := campaign.Nudge(ctx, b.planner, b.pub, b.topo, b.keys, b.now)
	require.NoError(t, err)
	require.Zero(t, n, "the cron does not nudge a waiting campaign")
	s, err := campaign.Get(ctx, b.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, campaign.Planning, s.State)
	require.Equal(t, int64(100), s.Planned)

	require.NoError(t, campaign.ChangeCohort(ctx, b.db.Pool, []string{"acme"}, true, "test"))
	n, err = campaign.Nudge(ctx, b.planner, b.pub, b.topo, b.keys, b.now)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 3, b.planAll(t, p, id), "two slices of 100 left, and the empty one that finds the end")

	require.NoError(t, campaign.SetCohort(ctx, b.db.Pool, []string{campaign.EveryTenant}, "test"))
	_, created, err := campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "globex", Name: "g", Channel: "email",
		Template: "renewal", Source: "globex-people", DueAt: &b.now, Deadline: b.now.Add(time.Hour)})
	require.NoError(t, err)
	require.True(t, created, "'*' enables every tenant")
}

// A campaign that sets no slice size takes the planner's configured one.
func TestTheSliceSizeIsThePlannersUnlessTheCampaignSetsOne(t *testing.T) {
	t.Parallel()
	b := setup(t, 450)
	id := b.create(t, "configured", 0)
	p := b.newPlanner("p1")
	p.SliceSize = 150
	require.Equal(t, 4, b.planAll(t, p, id), "three full slices, and the empty one that finds the end")
	require.Equal(t, int64(150), b.count(t, `SELECT max(rows_read) FROM campaign_slices WHERE campaign_id = $1`, id))
	own := b.create(t, "own", 300)
	require.Equal(t, 2, b.planAll(t, p, own))
	_, _, err := campaign.Create(context.Background(), b.db.Pool, campaign.Spec{Tenant: "acme", Name: "huge",
		Channel: "email", Template: "renewal", Source: "renewals", DueAt: &b.now, Deadline: b.now.Add(time.Hour),
		SliceSize: 10001})
	require.ErrorContains(t, err, `field "slice_size" must be between 1 and 10000`)
}

// No slice starts that could commit after the deadline: with less than a
// lease left, the campaign ends late, its remainder counted, and nothing
// more is planned.
func TestADeadlineNearerThanALeaseEndsLateWithoutStartingASlice(t *testing.T) {
	t.Parallel()
	b := setup(t, 500)
	ctx := context.Background()
	id := b.create(t, "nearly-out-of-time", 200)
	p := b.newPlanner("p1")
	_, err := p.Step(ctx, campaign.Command{ID: id})
	require.NoError(t, err)
	b.clock.Advance(48*time.Hour - 29*time.Second) // the lease is 30 s
	d, err := p.Step(ctx, campaign.Command{ID: id, Fence: 1})
	require.NoError(t, err)
	require.Equal(t, campaign.EndLate, d.Verdict, d.Reason)
	require.Contains(t, d.Reason, "less than a lease (30s) away")
	s, err := campaign.Get(ctx, b.db.Pool, id)
	require.NoError(t, err)
	require.Equal(t, campaign.Late, s.State)
	require.Equal(t, int64(200), s.Planned)
	require.Equal(t, int64(300), *s.Unplanned)
	require.Equal(t, int64(1), s.Slices, "no slice started after the first")
	require.Equal(t, 1, b.queued(t), "the first slice's continuation only: a late campaign publishes none")
}

// With a timestamptz date column, the recipient's day is the day that
// instant falls on in their zone, and the deadline is the instant itself.
func TestLocalDaysBeforeAnInstantUseTheRecipientsDay(t *testing.T) {
	t.Parallel()
	b := setup(t, 0)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `
		CREATE TABLE contracts (id text PRIMARY KEY, email text, ends_at timestamptz, tz text);
		GRANT SELECT ON contracts TO nudge_planner;
		INSERT INTO contracts VALUES
			('tokyo', 'a@example.org', '2027-03-07T20:00:00Z', 'Asia/Tokyo'),        -- 03-08 05:00 there
			('newyork', 'b@example.org', '2027-03-08T03:00:00Z', 'America/New_York'); -- 03-07 22:00 there
		SELECT nudge_campaign_source('contracts', 'acme', 'contracts', 'id', 'email', NULL, 'ends_at', 'tz')`)
	require.NoError(t, err)
	days, at := 7, localtime.Clock(9, 0)
	id, _, err := campaign.Create(ctx, b.db.Pool, campaign.Spec{Tenant: "acme", Name: "contracts", Channel: "email",
		Template: "renewal", Source: "contracts", DaysBefore: &days, AtLocal: &at, Deadline: utc("2027-06-01T00:00:00Z")})
	require.NoError(t, err)
	b.planAll(t, b.newPlanner("p1"), id)
	got := b.reminders(t, id)
	require.True(t, got["tokyo"].due.Equal(utc("2027-03-01T00:00:00Z")), "2027-03-01 09:00 JST, got %s", got["tokyo"].due)
	require.True(t, got["tokyo"].deadline.Equal(utc("2027-03-07T20:00:00Z")))
	require.True(t, got["newyork"].due.Equal(utc("2027-02-28T14:00:00Z")), "2027-02-28 09:00 EST, got %s", got["newyork"].due)
	require.True(t, got["newyork"].deadline.Equal(utc("2027-03-08T03:00:00Z")))
}
