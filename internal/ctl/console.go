package ctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/console"
)

func consoleCmd(connect connector, common *config.Common) *cobra.Command {
	var (
		bf        brokerFlags
		cfg       console.Config
		listen    string
		tokenFile string
		noBroker  bool
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console: the runbook's figures, reminder search and timelines, dead letters, and confirmed, audited actions",
		Long: `console serves the operator's web console on --listen until interrupted, reading the same
PostgreSQL and RabbitMQ as the fleet. Every page needs the token in --token-file (a mounted
Secret): sign in with it and your name, or send it as a bearer token or as the password of
basic authentication (the user name is recorded as the actor). Behind an SSO proxy, set
--trusted-user-header to the header the proxy sets to the operator's name; the proxy must
also send the token, so the header alone, from a client that went around the proxy, is refused.

Every action shows its dry run (how many reminders would change) and needs a reason; each is
the statement nudgectl runs, with the same events and operator_audit rows, the actor being
console:NAME. --read-only refuses every action. Recipients are masked unless --show-recipients.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tok, err := console.ReadTokenFile(tokenFile)
			if err != nil {
				return err
			}
			cfg.Token = tok
			log, err := common.Logger("console")
			if err != nil {
				return err
			}
			dlq, err := bf.dlq()
			if err != nil {
				return err
			}
			if noBroker {
				dlq.URL = ""
			}
			ctx, pool, done, err := connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			srv, err := console.New(cfg, console.Deps{DB: pool, DLQ: dlq, Log: log})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w", listen, err)
			}
			hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
				WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute}
			fmt.Fprintf(cmd.OutOrStdout(), "console listening on http://%s\n", ln.Addr())
			log.Info().Str("listen", ln.Addr().String()).Bool("read_only", cfg.ReadOnly).Msg("console started")
			errc := make(chan error, 1)
			go func() { errc <- hs.Serve(ln) }()
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	bf.register(f)
	f.StringVar(&listen, "listen", "127.0.0.1:8090", "address to serve the console on")
	f.StringVar(&tokenFile, "token-file", "", "file holding the console's token (required; at least 16 characters)")
	f.BoolVar(&cfg.ReadOnly, "read-only", false, "refuse every action: figures, searches and timelines only")
	f.BoolVar(&cfg.ShowRecipients, "show-recipients", false, "show recipients in full (masked otherwise)")
	f.StringVar(&cfg.TrustedUserHeader, "trusted-user-header", "",
		"header an SSO proxy sets to the operator's name (X-Forwarded-User); the token is still required")
	f.BoolVar(&noBroker, "no-broker", false, "do not read the dead-letter queues (no broker pages)")
	return cmd
}
