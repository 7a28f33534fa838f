package campaigntest

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/testenv"
)

// Env is a planning queue of one test and a planner on it.
type Env struct {
	DB       *testenv.DB
	Topology broker.Topology
	Planner  *campaign.Planner
}

// New declares a planning queue of the test's own (one retry tier, to spend
// few of the broker's file handles), deleted when the test ends, and a
// planner that runs as db's owner with the "plan" channel key only.
func New(t testing.TB, db *testenv.DB, clk clock.Clock) *Env {
	t.Helper()
	mq := cmp.Or(os.Getenv("NUDGE_TEST_AMQP_URL"), testenv.DefaultAMQPURL)
	topo := broker.Topology{Prefix: "t-" + testenv.RandomID(), Channels: []string{campaign.Channel},
		RetryTiers: []time.Duration{time.Second}}.WithDefaults()
	conn, err := broker.Dial(mq, "campaigntest")
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ at "+mq, "start it", err)
		return nil
	}
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, topo.Declare(ch))
	conn.Close()
	t.Cleanup(func() {
		if conn, err := broker.Dial(mq, "campaigntest-cleanup"); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_ = topo.Delete(ch)
			}
			conn.Close()
		}
	})
	root, err := message.ParseKeys("k1:campaigntest-secret-0123456789abcdef")
	require.NoError(t, err)
	spec, err := root.ChannelSpec(campaign.Channel)
	require.NoError(t, err)
	keys, err := message.ParseKeys(spec)
	require.NoError(t, err)
	pub := broker.NewPublisher(mq, topo, "campaigntest")
	t.Cleanup(pub.Close)
	return &Env{DB: db, Topology: topo, Planner: &campaign.Planner{Pool: db.Pool, Keys: keys, Publisher: pub,
		Topology: topo, Clock: clk, Name: "campaigntest", Log: zerolog.Nop()}}
}

// Audience creates the table audience_<source> of n learners (key 1..n,
// learner-N@example.org; the keys listed in noEmail have no address, a bad
// row) and registers it as the source named source of tenant.
func (e *Env) Audience(t testing.TB, tenant, source string, n int, noEmail ...int) {
	t.Helper()
	table := "audience_" + source
	_, err := e.DB.Pool.Exec(context.Background(), fmt.Sprintf(`
		CREATE TABLE %[1]s (id bigint PRIMARY KEY, email text);
		INSERT INTO %[1]s SELECT i, 'learner-' || i || '@example.org' FROM generate_series(1, %[2]d) i;
		UPDATE %[1]s SET email = NULL WHERE id = ANY('{%[3]s}'::bigint[]);
		GRANT SELECT ON %[1]s TO nudge_planner;
		SELECT nudge_campaign_source('%[4]s', '%[5]s', '%[1]s', 'id', 'email', NULL, NULL)`,
		table, n, joinInts(noEmail), source, tenant))
	require.NoError(t, err)
}

func joinInts(ns []int) string {
	s := ""
	for i, n := range ns {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprint(n)
	}
	return s
}

// Create creates the campaign name of tenant over source, due at due, with
// its deadline a day later.
func (e *Env) Create(t testing.TB, tenant, name, source string, sliceSize int, due time.Time) int64 {
	t.Helper()
	id, _, err := campaign.Create(context.Background(), e.DB.Pool, campaign.Spec{Tenant: tenant, Name: name,
		Channel: "email", Template: "renewal", Source: source, DueAt: &due, Deadline: due.Add(24 * time.Hour),
		SliceSize: sliceSize})
	require.NoError(t, err)
	return id
}

// Plan runs up to slices planning commands of campaign id through the
// planner, each at the campaign's current fence, as the chain of
// continuations would, and returns the verdicts.
func (e *Env) Plan(t testing.TB, id int64, slices int) []campaign.Verdict {
	t.Helper()
	ctx := context.Background()
	var out []campaign.Verdict
	for range slices {
		var (
			tenant   string
			deadline time.Time
			fence    int64
		)
		require.NoError(t, e.DB.Pool.QueryRow(ctx, `SELECT tenant, deadline, fence FROM campaigns WHERE id = $1`, id).
			Scan(&tenant, &deadline, &fence))
		d, err := e.Planner.Step(ctx, campaign.Command{ID: id, Fence: fence, Tenant: tenant, Deadline: deadline})
		require.NoError(t, err)
		out = append(out, d.Verdict)
	}
	return out
}
