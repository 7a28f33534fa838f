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
	db, mq := testenv.Postgres(t), testenv.RabbitMQ(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root, err := message.ParseKeys("k1:fleet-test-secret-0123456789abcdef")
	require.NoError(t, err)
	planKey, err := root.ChannelSpec(campaign.Channel)
	require.NoError(t, err)
	keys, err := message.ParseKeys(planKey)
	require.NoError(t, err)
	var o fleet.Planner
	parse(t, o.RegisterFlags)
	o.Common.DatabaseURL, o.Common.AMQPURL, o.Common.SigningKeys = db.URL, mq.URL, planKey
	o.Common.QueuePrefix, o.Common.DeclareTopology = "t-"+testenv.RandomID(), true
	topo := campaign.Topology(o.Common.QueuePrefix)
	deleteTopology(t, mq.URL, topo)

	_, err = db.Pool.Exec(ctx, `
		CREATE TABLE audience (id bigint PRIMARY KEY, email text);
		INSERT INTO audience SELECT i, 'l' || i || '@example.org' FROM generate_series(1, 450) i;
		GRANT SELECT ON audience TO nudge_planner;
		SELECT nudge_campaign_source('aud', 'acme', 'audience', 'id', 'email', NULL, NULL)`)
	require.NoError(t, err)
	due := time.Now().Add(time.Hour)
	ids := map[string]int64{}
	for _, name := range []string{"planned", "waiting"} {
		ids[name], _, err = campaign.Create(ctx, db.Pool, campaign.Spec{Tenant: "acme", Name: name, Channel: "email",
			Template: "t", Source: "aud", DueAt: &due, Deadline: due.Add(time.Hour), SliceSize: 200})
		require.NoError(t, err)
	}
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
