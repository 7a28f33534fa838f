package campaign_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/message"
)

// childEnv, when set, makes the test binary a planner process (the kill
// test starts it, and SIGKILLs it, as a real process): it consumes the
// planning queue until SIGTERM.
const childEnv = "NUDGE_CAMPAIGN_PLANNER_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if err := runChild(); err != nil {
			fmt.Fprintln(os.Stderr, "planner child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runChild() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("PLANNER_DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	keys, err := message.ParseKeys(os.Getenv("PLANNER_KEYS"))
	if err != nil {
		return err
	}
	topo := broker.Topology{Prefix: os.Getenv("PLANNER_PREFIX"), Channels: []string{campaign.Channel}}.WithDefaults()
	pub := broker.NewPublisher(os.Getenv("PLANNER_AMQP_URL"), topo, os.Getenv(childEnv))
	defer pub.Close()
	p := &campaign.Planner{Pool: pool, Keys: keys, Publisher: pub, Topology: topo, Clock: clock.Real{},
		Name: os.Getenv(childEnv), Log: zerolog.New(os.Stderr).With().Timestamp().Logger()}
	return p.Consume(ctx, os.Getenv("PLANNER_AMQP_URL"))
}
