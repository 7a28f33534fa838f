package fleet_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/fleet"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/testenv"
)

// The planner's /metrics, scraped over HTTP while it consumes for real: a
// campaign planned in three slices with its first command published twice
// counts three planned slices, one stale duplicate dropped, two lease
// extensions (continuations); a campaign nobody nudged is the oldest
// runnable one, its wait measured on the planner's clock.
func TestPlannerExportsPlanningMetrics(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newPlannerFixture(t, "planned", "waiting")
	o, db, mq, keys, ids, due := f.o, f.db, f.mq, f.keys, f.ids, f.due
	topo := campaign.Topology(o.Common.QueuePrefix)
	// The planner's clock runs ten minutes ahead of the database's.
	clk := clock.NewFake(time.Now().Add(10 * time.Minute))
	o.Listen = freeAddr(t)
	done := make(chan error, 1)
	go func() {
		done <- o.Run(ctx, fleet.Env{Log: zerolog.Nop(), Registry: probe.NewRegistry(), Clock: clk})
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	url := "http://" + o.Listen + "/metrics"
	require.Eventually(t, func() bool {
		resp, err := http.Get(url) //nolint:gosec,noctx // a test's loopback URL
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the planner serves /metrics")
	before := scrape(t, url)
	require.Contains(t, before, `nudge_campaign_slices_total{outcome="lease_expired"}`, "every outcome from the start")
	require.Zero(t, before[`nudge_campaign_slices_total{outcome="planned"}`])

	pub := broker.NewPublisher(mq.URL, topo, "fleet-test")
	defer pub.Close()
	cmd := campaign.Command{ID: ids["planned"], Tenant: "acme", Deadline: due.Add(time.Hour)}
	require.NoError(t, campaign.Publish(ctx, pub, topo, keys, time.Now(), cmd, cmd))
	require.Eventually(t, func() bool {
		s, err := campaign.Get(ctx, db.Pool, ids["planned"])
		require.NoError(t, err)
		return s.State == campaign.Done
	}, 30*time.Second, 50*time.Millisecond, "the chain of commands plans the campaign")
	require.Eventually(t, func() bool {
		return scrape(t, url)[`nudge_campaign_slices_total{outcome="duplicate"}`] == 1
	}, 10*time.Second, 20*time.Millisecond, "the duplicate is dropped")

	m := scrape(t, url)
	require.Equal(t, 3.0, m[`nudge_campaign_slices_total{outcome="planned"}`])
	require.Equal(t, 1.0, m[`nudge_campaign_duplicates_suppressed_total{kind="stale"}`])
	require.Equal(t, 0.0, m[`nudge_campaign_duplicates_suppressed_total{kind="ahead"}`])
	require.Equal(t, 0.0, m[`nudge_campaign_slices_total{outcome="failed"}`])
	require.Equal(t, 2.0, m[`nudge_campaign_lease_extensions_total`], "a continuation after each slice but the last")
	require.Equal(t, 3.0, m[`nudge_campaign_slice_duration_seconds_count`])
	require.Equal(t, 1.0, m[`nudge_campaigns_runnable`], "the campaign nobody nudged")
	require.Equal(t, 1.0, m[`nudge_campaign_scrape_success`])
	for _, g := range []string{"nudge_campaign_oldest_runnable_seconds", "nudge_campaign_checkpoint_lag_seconds"} {
		require.InDelta(t, 600, m[g], 60, "%s: the waiting campaign, created ten minutes before the planner's now", g)
	}
}

// Where no CronJob nudges (docker compose), --nudge-every makes a consuming
// planner publish the commands itself: a campaign nobody published a command
// for is planned to the end; --nudge with it is refused.
func TestPlannerNudgesItselfEvery(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := newPlannerFixture(t, "self-nudged")
	o, db, id := f.o, f.db, f.ids["self-nudged"]
	o.Listen = ""

	o.Nudge, o.NudgeEvery = true, time.Minute
	require.ErrorContains(t, o.Run(ctx, fleet.Env{Log: zerolog.Nop(), Registry: probe.NewRegistry(), Clock: clock.Real{}}),
		"--nudge-every is for a consuming planner")
	o.Nudge = false
	done := make(chan error, 1)
	go func() {
		done <- o.Run(ctx, fleet.Env{Log: zerolog.Nop(), Registry: probe.NewRegistry(), Clock: clock.NewFake(time.Now())})
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.Eventually(t, func() bool {
		s, err := campaign.Get(ctx, db.Pool, id)
		require.NoError(t, err)
		return s.State == campaign.Done && s.Planned == 450
	}, 30*time.Second, 50*time.Millisecond, "the planner's own nudge starts the chain, which plans the campaign")
}

// plannerFixture is a planner's options on a queue prefix of the test's own
// (deleted after it), its "plan" keys, and the campaigns named, of 450
// audience rows in slices of 200.
type plannerFixture struct {
	o    fleet.Planner
	db   *testenv.DB
	mq   *testenv.Broker
	keys *message.Keyring
	ids  map[string]int64
	due  time.Time
}

func newPlannerFixture(t *testing.T, campaigns ...string) plannerFixture {
	t.Helper()
	ctx := context.Background()
	f := plannerFixture{db: testenv.Postgres(t), mq: testenv.RabbitMQ(t), ids: map[string]int64{}}
	root, err := message.ParseKeys("k1:fleet-test-secret-0123456789abcdef")
	require.NoError(t, err)
	planKey, err := root.ChannelSpec(campaign.Channel)
	require.NoError(t, err)
	f.keys, err = message.ParseKeys(planKey)
	require.NoError(t, err)
	parse(t, f.o.RegisterFlags)
	f.o.Common.DatabaseURL, f.o.Common.AMQPURL, f.o.Common.SigningKeys = f.db.URL, f.mq.URL, planKey
	f.o.Common.QueuePrefix, f.o.Common.DeclareTopology = "t-"+testenv.RandomID(), true
	deleteTopology(t, f.mq.URL, campaign.Topology(f.o.Common.QueuePrefix))
	_, err = f.db.Pool.Exec(ctx, `
		CREATE TABLE audience (id bigint PRIMARY KEY, email text);
		INSERT INTO audience SELECT i, 'l' || i || '@example.org' FROM generate_series(1, 450) i;
		GRANT SELECT ON audience TO nudge_planner;
		SELECT nudge_campaign_source('aud', 'acme', 'audience', 'id', 'email', NULL, NULL)`)
	require.NoError(t, err)
	f.due = time.Now().Add(time.Hour)
	for _, name := range campaigns {
		f.ids[name], _, err = campaign.Create(ctx, f.db.Pool, campaign.Spec{Tenant: "acme", Name: name, Channel: "email",
			Template: "t", Source: "aud", DueAt: &f.due, Deadline: f.due.Add(time.Hour), SliceSize: 200})
		require.NoError(t, err)
	}
	return f
}
