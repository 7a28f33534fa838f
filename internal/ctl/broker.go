package ctl

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/config"
)

// topologyFlags name the broker and the topology's prefix for the commands
// that declare or check it.
type topologyFlags struct {
	amqpURL, prefix string
}

func (tf *topologyFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&tf.amqpURL, "amqp-url", config.DefaultAMQPURL, "RabbitMQ connection URL")
	fs.StringVar(&tf.prefix, "queue-prefix", broker.DefaultPrefix, "prefix of every exchange and queue name")
}

func (tf *topologyFlags) topology() broker.Topology {
	return broker.Topology{Prefix: tf.prefix}.WithDefaults()
}

// declare declares the whole topology, the planning queue's too, and says
// so on out.
func (tf *topologyFlags) declare(out io.Writer) error {
	t := tf.topology()
	for _, d := range []broker.Topology{t, t.Planning()} {
		if err := d.PrepareAt(tf.amqpURL, "nudgectl-declare", true, broker.Uses{}); err != nil {
			return fmt.Errorf("declaring the broker topology: %w", err)
		}
	}
	fmt.Fprintf(out, "declared the broker topology: exchanges %s, %d queues (prefix %s)\n",
		strings.Join(t.Exchanges(), ", "), len(t.Queues()), t.Prefix)
	fmt.Fprintf(out, "declared the planning queue %s (%d queues)\n", t.Planning().Queue(broker.PlanChannel),
		len(t.Planning().Queues()))
	return nil
}

// check checks that the whole topology exists and says so on out. The
// planning queue is not part of it: only the planner needs it, and checks it
// at its own start.
func (tf *topologyFlags) check(out io.Writer) error {
	t := tf.topology()
	if err := t.PrepareAt(tf.amqpURL, "nudgectl-check", false, t.AllUses()); err != nil {
		return fmt.Errorf("checking the broker topology: %w", err)
	}
	fmt.Fprintf(out, "the broker topology is complete: exchanges %s, %d queues (prefix %s)\n",
		strings.Join(t.Exchanges(), ", "), len(t.Queues()), t.Prefix)
	return nil
}

func brokerCmd() *cobra.Command {
	var tf topologyFlags
	cmd := &cobra.Command{
		Use:   "broker",
		Short: "Declare or check the RabbitMQ topology (exchanges, queues, bindings)",
		Long: `The dispatcher, the workers and the reconciler never declare the topology: at start they
check, with passive declares (which need no permission), that the exchanges and queues they use
exist, and stop naming what is missing. The topology is declared once, by a RabbitMQ user allowed
to configure Nudge's names (nudge-migrate in deploy/rabbitmq/definitions.json): the migration
step does it with ` + "`nudgectl migrate --declare-topology`" + `; these commands do it on their own.`,
	}
	tf.register(cmd.PersistentFlags())
	cmd.AddCommand(&cobra.Command{
		Use:   "declare",
		Short: "Declare every exchange, queue and binding (idempotent; fails on a queue declared with other arguments)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return tf.declare(cmd.OutOrStdout()) },
	}, &cobra.Command{
		Use:   "check",
		Short: "Check, with passive declares, that every exchange and queue exists (any user may)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return tf.check(cmd.OutOrStdout()) },
	})
	return cmd
}
