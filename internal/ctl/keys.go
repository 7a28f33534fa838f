package ctl

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// keysCmd derives what a worker is given instead of the root signing keys:
// each message is signed with a key derived for the channel it names, so a
// worker holding only its channel's keys cannot sign another channel's work.
func keysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Derive the per-channel signing keys a worker is given instead of the root keys",
	}
	var signingKeys, channel string
	derive := &cobra.Command{
		Use:   "derive",
		Short: "Print the signing-key setting of a worker of --channel, derived from the root keys",
		Long: `derive reads the root signing keys (--signing-keys, KID:SECRET[,KID:SECRET...]) and prints,
for each of them in order, the key of --channel derived from it (KID@CHANNEL:HEX, comma-separated):
the NUDGE_SIGNING_KEYS of that channel's worker (--channel plan: of the campaign planner, which
signs and verifies planning commands only). Such a worker signs and verifies its channel's
messages only; the dispatcher, the reconciler and nudgectl keep the root keys. Derive again after
every rotation of the root keys (docs/deploy.md). The output is a secret: pipe it into the secret
store rather than a terminal log.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !reminder.Channel(channel).Valid() && channel != broker.PlanChannel {
				return fmt.Errorf("--channel %q: want email, sms, webhook or %s (the planner's)", channel, broker.PlanChannel)
			}
			if signingKeys == "" {
				return errors.New("--signing-keys (or NUDGE_SIGNING_KEYS) is required: the root keys, KID:SECRET[,KID:SECRET...]")
			}
			k, err := message.ParseKeys(signingKeys)
			if err != nil {
				return fmt.Errorf("--signing-keys: %w", err)
			}
			if !k.Root() {
				return errors.New("--signing-keys holds channel keys only: derive from the root keys (KID:SECRET)")
			}
			spec, err := k.ChannelSpec(channel)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), spec)
			return nil
		},
	}
	derive.Flags().StringVar(&signingKeys, "signing-keys", "", "the root signing keys, KID:SECRET[,KID:SECRET...]")
	derive.Flags().StringVar(&channel, "channel", "", "the worker's channel: email, sms or webhook; plan for the campaign planner")
	cmd.AddCommand(derive)
	return cmd
}
