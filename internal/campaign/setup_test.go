package campaign_test

import (
	"context"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/testenv"
)

// testKeys is the root keyring of these tests; planners get only its
// "plan" channel key, as in production.
const testKeys = "k1:campaign-test-secret-0123456789abcdef"

type bundle struct {
	db       *testenv.DB
	amqpURL  string
	topo     broker.Topology
	planner  *pgxpool.Pool // a login of nudge_planner
	plannerU string        // its URL
	keys     *message.Keyring
	pub      *broker.Publisher
	clock    *clock.Fake
	now      time.Time
}

// setup gives a test a migrated schema, a planning queue of its own (one
// retry tier, to spend few of the broker's file handles), a nudge_planner
// login, and an audience source "renewals" of tenant acme with rows
// learner 1..n: learner-N@example.org, {"learner": N}, expiring on
// 2027-01-31 UTC.
func setup(t *testing.T, n int) *bundle {
	t.Helper()
	ctx := context.Background()
	b := &bundle{db: testenv.Postgres(t)}
	b.amqpURL = os.Getenv("NUDGE_TEST_AMQP_URL")
	if b.amqpURL == "" {
		b.amqpURL = testenv.DefaultAMQPURL
	}
	b.topo = broker.Topology{Prefix: "t-" + testenv.RandomID(), Channels: []string{campaign.Channel},
		RetryTiers: []time.Duration{time.Second}}.WithDefaults()
	conn, err := broker.Dial(b.amqpURL, "campaign-test")
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ at "+b.amqpURL, "start it", err)
		return nil
	}
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, b.topo.Declare(ch))
	conn.Close()
	t.Cleanup(func() {
		if conn, err := broker.Dial(b.amqpURL, "campaign-test-cleanup"); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_ = b.topo.Delete(ch)
			}
			conn.Close()
		}
	})

	_, err = b.db.Pool.Exec(ctx, `
		CREATE TABLE renewals (learner_id bigint PRIMARY KEY, email text, profile jsonb, expires_on date);
		GRANT SELECT ON renewals TO nudge_planner;
		SELECT nudge_campaign_source('renewals', 'acme', 'renewals', 'learner_id', 'email', 'profile', 'expires_on')`)
	require.NoError(t, err)
	if n > 0 {
		_, err = b.db.Pool.Exec(ctx, `
			INSERT INTO renewals
			SELECT i, 'learner-' || i || '@example.org', jsonb_build_object('learner', i), date '2027-01-31'
			  FROM generate_series(1, $1) i`, n)
		require.NoError(t, err)
	}
	b.planner, _, b.plannerU = b.login(t, "nudge_planner")

	root, err := message.ParseKeys(testKeys)
	require.NoError(t, err)
	spec, err := root.ChannelSpec(campaign.Channel)
	require.NoError(t, err)
	b.keys, err = message.ParseKeys(spec)
	require.NoError(t, err)
	b.pub = broker.NewPublisher(b.amqpURL, b.topo, "campaign-test")
	t.Cleanup(b.pub.Close)
	// The database admits a campaign against its own now(), so the fake clock
	// starts at the real time (to the microsecond PostgreSQL keeps).
	b.now = time.Now().UTC().Truncate(time.Microsecond)
	b.clock = clock.NewFake(b.now)
	return b
}

// login creates a LOGIN role, a member of group, for this test only and
// returns a pool connected as it, its name and its URL.
func (b *bundle) login(t *testing.T, group string) (*pgxpool.Pool, string, string) {
	t.Helper()
	ctx := context.Background()
	name := "nudge_t_" + testenv.RandomID()
	ident := pgx.Identifier{name}.Sanitize()
	_, err := b.db.Pool.Exec(ctx, `CREATE ROLE `+ident+` LOGIN IN ROLE `+pgx.Identifier{group}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.db.Pool.Exec(context.Background(), `DROP OWNED BY `+ident+`; DROP ROLE `+ident)
	})
	u, err := url.Parse(b.db.URL)
	require.NoError(t, err)
	u.User = url.User(name)
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, name, u.String()
}

func (b *bundle) newPlanner(name string) *campaign.Planner {
	return &campaign.Planner{Pool: b.planner, Keys: b.keys, Publisher: b.pub, Topology: b.topo,
		Clock: b.clock, Name: name, Log: zerolog.Nop()}
}

// create creates a campaign of acme over renewals, due at a fixed instant.
func (b *bundle) create(t *testing.T, name string, sliceSize int) int64 {
	t.Helper()
	due := b.now.Add(time.Hour)
	id, created, err := campaign.Create(context.Background(), b.db.Pool, campaign.Spec{Tenant: "acme", Name: name,
		Channel: "email", Template: "renewal", Source: "renewals", DueAt: &due,
		Deadline: b.now.Add(48 * time.Hour), SliceSize: sliceSize})
	require.NoError(t, err)
	require.True(t, created)
	return id
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// queued is how many planning commands wait in the planning queue.
func (b *bundle) queued(t *testing.T) int {
	t.Helper()
	conn, err := broker.Dial(b.amqpURL, "campaign-test-depth")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(b.topo.Queue(campaign.Channel), true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}
