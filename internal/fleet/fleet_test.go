package fleet_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/dispatch"
	"github.com/nudgehq/nudge/internal/fleet"
	"github.com/nudgehq/nudge/internal/probe"
	"github.com/nudgehq/nudge/internal/reconcile"
	"github.com/nudgehq/nudge/internal/retention"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/internal/worker"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// parse registers a binary's flags and parses an empty command line.
func parse(t *testing.T, register func(*pflag.FlagSet)) {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	register(fs)
	require.NoError(t, fs.Parse(nil))
}

// A binary started without flags runs with the library's defaults: the flag
// defaults come from WithDefaults, and a flag whose default is 0 is one the
// library derives (prefetch, send-lease, burst).
func TestFlagDefaultsAreTheLibraryDefaults(t *testing.T) {
	t.Parallel()
	t.Run("dispatcher", func(t *testing.T) {
		var o fleet.Dispatcher
		parse(t, o.RegisterFlags)
		def := dispatch.Config{}.WithDefaults()
		require.Equal(t, def, o.Config.WithDefaults())
		require.Zero(t, o.Config.BurstEnvelopeSize, "derived from --envelope-size: 0 (derive)")
		derived := o.Config
		derived.BurstEnvelopeSize = def.BurstEnvelopeSize
		require.Equal(t, def, derived)
	})
	t.Run("reconciler", func(t *testing.T) {
		var o fleet.Reconciler
		parse(t, o.RegisterFlags)
		require.Equal(t, reconcile.Config{}.WithDefaults(), o.Config)
		require.Equal(t, retention.Config{}.WithDefaults(), o.Retention)
		require.Equal(t, reconcile.DefaultEvery, o.Every)
		require.Equal(t, reconcile.DefaultCleanEvery, o.CleanEvery)
		require.Equal(t, fleet.DefaultListen, o.Listen)
	})
	for _, ch := range reminder.Channels {
		t.Run(string(ch)+"-worker", func(t *testing.T) {
			o := fleet.Worker{Config: worker.Config{Channel: ch}}
			parse(t, o.RegisterFlags)
			def := worker.Config{Channel: ch}.WithDefaults()
			require.Equal(t, def, o.Config.WithDefaults())
			derived := worker.Config{Channel: ch, Prefetch: o.Config.Prefetch, SendLease: o.Config.SendLease, Burst: o.Config.Burst,
				DeadlineMargin: o.Config.DeadlineMargin}
			require.Equal(t, worker.Config{Channel: ch}, derived, "derived settings default to 0 (derive)")
			require.Equal(t, fleet.DefaultListen, o.Listen)
		})
	}
	t.Run("common", func(t *testing.T) {
		var c config.Common
		parse(t, func(fs *pflag.FlagSet) { c.RegisterDB(fs); c.RegisterBroker(fs) })
		require.Equal(t, broker.Topology{}.WithDefaults(), c.Topology())
	})
}

func env() fleet.Env {
	return fleet.Env{Log: zerolog.Nop(), Registry: probe.NewRegistry(), Clock: clock.Real{}}
}

// The dispatcher and the reconciler check the topology before anything else
// touches the broker: a missing work queue stops them at start, by name.
func TestPublishersCheckTheTopologyAndDeclareOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	db, mq := testenv.Postgres(t), testenv.RabbitMQ(t)
	common := config.Common{DatabaseURL: db.URL, AMQPURL: mq.URL, SigningKeys: "test:0123456789abcdef0123",
		QueuePrefix: "t-" + testenv.RandomID(), LogLevel: "warn", LogFormat: "json"}
	topo := common.Topology()
	deleteTopology(t, mq.URL, topo)
	ctx := context.Background()

	d := fleet.Dispatcher{Common: common}
	err := d.Run(ctx, fleet.Env{Log: zerolog.Nop(), Registry: prometheus.NewRegistry(), Clock: clock.Real{}})
	require.ErrorIs(t, err, broker.ErrTopologyMissing)
	require.Contains(t, err.Error(), "exchange "+topo.WorkExchange()+", queue "+topo.Queue("email")+", queue "+topo.Queue("sms"))

	r := fleet.Reconciler{Common: common, Once: true}
	require.ErrorIs(t, r.Run(ctx, env()), broker.ErrTopologyMissing)

	d.Common.DeclareTopology = true
	require.NoError(t, d.Run(ctx, fleet.Env{Log: zerolog.Nop(), Registry: prometheus.NewRegistry(), Clock: clock.Real{}}),
		"declares, then one run over an empty table")
	var runs int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM dispatch_runs`).Scan(&runs))
	require.Equal(t, 1, runs, "the run is recorded, idle as it was")
	require.NoError(t, r.Run(ctx, env()), "declared now: the check passes")
}

// Issue 13, finding 7: with the broker down at start, the reconciler and the
// dispatcher exited at once ("preparing the broker topology: connecting to
// RabbitMQ … refused"), and 500 reminders stayed pending 90 s past their
// deadlines. Now both start: the reconciler expires them within a few
// passes, and a dispatcher run expires what is late, claims nothing, and
// fails naming the broker.
func TestBrokerDownAtStartStillExpiresLateWork(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "amqp://guest:guest@" + ln.Addr().String() + "/"
	require.NoError(t, ln.Close()) // nothing listens there now
	common := config.Common{DatabaseURL: db.URL, AMQPURL: closed, SigningKeys: "test:0123456789abcdef0123",
		QueuePrefix: "t-" + testenv.RandomID(), LogLevel: "warn", LogFormat: "json"}
	clk := clock.NewShifted(0)
	schedule := func(prefix string, n int) {
		t.Helper()
		now := clk.Now()
		reqs := make([]intake.Request, n)
		for i := range reqs {
			reqs[i] = intake.Request{Tenant: "acme", Key: fmt.Sprintf("%s-%d", prefix, i), Channel: reminder.Email,
				Recipient: "a@example.com", Template: "t", DueAt: now.Add(-time.Minute), Deadline: now.Add(3 * time.Second)}
		}
		_, err := intake.ScheduleMany(context.Background(), db.Pool, reqs)
		require.NoError(t, err)
	}
	count := func(state reminder.State) int {
		var n int
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM reminder_state WHERE state = $1`,
			string(state)).Scan(&n))
		return n
	}
	env := fleet.Env{Log: zerolog.Nop(), Registry: probe.NewRegistry(), Clock: clk}

	schedule("r", 500)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r := fleet.Reconciler{Common: common, Every: 100 * time.Millisecond, CleanEvery: time.Hour}
	go func() { done <- r.Run(ctx, env) }()
	clk.Advance(5 * time.Second) // past the deadlines
	require.Eventually(t, func() bool { return count(reminder.Expired) == 500 }, 15*time.Second, 20*time.Millisecond,
		"the reconciler expires late work while the broker is down")
	cancel()
	require.NoError(t, <-done)

	schedule("d", 500)
	clk.Advance(5 * time.Second)
	d := fleet.Dispatcher{Common: common}
	err = d.Run(context.Background(), fleet.Env{Log: zerolog.Nop(), Registry: prometheus.NewRegistry(), Clock: clk})
	require.ErrorIs(t, err, dispatch.ErrBrokerUnavailable)
	require.Equal(t, 1000, count(reminder.Expired), "the dispatcher's run expired the late ones")
	var claims int
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM reminder_timeline WHERE reason = 'claimed for dispatch'`).Scan(&claims))
	require.Zero(t, claims)
}

// deleteTopology deletes topo's exchanges and queues when t ends.
func deleteTopology(t *testing.T, url string, topo broker.Topology) {
	t.Helper()
	t.Cleanup(func() {
		if conn, err := broker.Dial(url, "fleet-test-cleanup"); err == nil {
			defer conn.Close()
			if ch, err := conn.Channel(); err == nil {
				_ = topo.Delete(ch)
			}
		}
	})
}
