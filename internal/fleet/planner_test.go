package fleet_test

import (
	"context"
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

// The planner's CronJob (--nudge) publishes one planning command per
// campaign still planning; a planner without the "plan" key refuses to start.
func TestPlannerNudgesEveryPlanningCampaign(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	mq := testenv.RabbitMQ(t)
	plan := mq.Topology.Planning()
	conn, err := broker.Dial(mq.URL, "fleet-test")
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, plan.Declare(ch))
	conn.Close()
	t.Cleanup(func() {
		if conn, err := broker.Dial(mq.URL, "fleet-test-cleanup"); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_ = plan.Delete(ch)
			}
			conn.Close()
		}
	})
	ctx := context.Background()
	_, err = db.Pool.Exec(ctx, `
		CREATE TABLE audience (id bigint PRIMARY KEY, email text);
		GRANT SELECT ON audience TO nudge_planner;
		SELECT nudge_campaign_source('aud', 'acme', 'audience', 'id', 'email', NULL, NULL)`)
	require.NoError(t, err)
	due := time.Now().Add(time.Hour)
	for _, name := range []string{"a", "b", "paused"} {
		id, _, err := campaign.Create(ctx, db.Pool, campaign.Spec{Tenant: "acme", Name: name, Channel: "email",
			Template: "t", Source: "aud", DueAt: &due, Deadline: due.Add(time.Hour)})
		require.NoError(t, err)
		if name == "paused" {
			_, err = campaign.Set(ctx, db.Pool, "acme", id, campaign.Pause)
			require.NoError(t, err)
		}
	}

	root, err := message.ParseKeys("k1:fleet-test-secret-0123456789abcdef")
	require.NoError(t, err)
	sms, err := root.ChannelSpec("sms")
	require.NoError(t, err)
	planKey, err := root.ChannelSpec(campaign.Channel)
	require.NoError(t, err)
	run := func(keys string) error {
		var o fleet.Planner
		parse(t, o.RegisterFlags)
		o.Nudge = true
		o.Common.DatabaseURL, o.Common.AMQPURL, o.Common.QueuePrefix, o.Common.SigningKeys = db.URL, mq.URL, mq.Topology.Prefix, keys
		return o.Run(ctx, fleet.Env{Log: zerolog.Nop(), Registry: probe.NewRegistry(), Clock: clock.Real{}})
	}
	require.ErrorContains(t, run(sms), `no key for channel "plan"`)
	require.NoError(t, run(planKey))

	conn, err = broker.Dial(mq.URL, "fleet-test-depth")
	require.NoError(t, err)
	defer conn.Close()
	ch, err = conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(plan.Queue(campaign.Channel), true, false, false, false, nil)
	require.NoError(t, err)
	require.Equal(t, 2, q.Messages, "one command per planning campaign, none for the paused one")
}
