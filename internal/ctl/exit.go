package ctl

import (
	"context"
	"errors"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/ops"
	"github.com/nudgehq/nudge/pkg/intake"
)

// nudgectl's exit statuses, the same for every command, so that a script
// (or an operator at 03:00) can tell what kind of failure it met without
// reading the message (docs/runbook.md lists them).
const (
	// ExitOK: the command did what it was asked; stats: every runbook
	// answer is within its objective.
	ExitOK = 0
	// ExitFailed: anything not listed below.
	ExitFailed = 1
	// ExitUsage: a flag, an argument or an input line is wrong (schedule -f
	// with rejected lines too); nothing was changed for what was wrong.
	ExitUsage = 2
	// ExitNotFound: the reminder or message named does not exist.
	ExitNotFound = 3
	// ExitUnreachable: PostgreSQL or RabbitMQ could not be reached.
	ExitUnreachable = 4
	// ExitSchema: the database has no Nudge schema, or an older one: run
	// nudgectl migrate.
	ExitSchema = 5
	// ExitUnhealthy: stats answered, and a runbook answer is bad (no
	// dispatcher run recorded, cutoff lag or oldest due over objective, …).
	ExitUnhealthy = 6
)

// usageError marks an error in what the operator typed.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usage marks err as the operator's input's fault (ExitUsage).
func usage(err error) error { return usageError{err} }

// errNoSuchMessage: dlq show named a message the queue does not hold.
var errNoSuchMessage = errors.New("no such message")

// errSchemaMissing replaces PostgreSQL's "relation does not exist".
var errSchemaMissing = errors.New("the database has no Nudge schema, or an older one: run nudgectl migrate")

// ExitCode is the exit status for err (nil: ExitOK).
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	var exit *config.ExitError
	if errors.As(err, &exit) {
		return exit.Code
	}
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	var netErr net.Error
	var ue usageError
	switch {
	case errors.As(err, &ue), errors.Is(err, ops.ErrNoReason), errors.Is(err, ops.ErrNoActor),
		errors.Is(err, ops.ErrNoSelection):
		return ExitUsage
	case errors.Is(err, intake.ErrNotFound), errors.Is(err, pgx.ErrNoRows), errors.Is(err, errNoSuchMessage):
		return ExitNotFound
	case errors.Is(err, errSchemaMissing),
		errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883" || pgErr.Code == "42703"):
		return ExitSchema
	case errors.As(err, &connErr), errors.As(err, &netErr), errors.Is(err, amqp.ErrClosed),
		errors.Is(err, context.DeadlineExceeded):
		return ExitUnreachable
	}
	return ExitFailed
}

// withExitCodes makes every command of the tree under c return an
// *config.ExitError carrying ExitCode (config.Execute exits with it): flag
// and argument errors are ExitUsage, a missing schema says to migrate.
func withExitCodes(c *cobra.Command) {
	c.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return exitError(usage(err)) })
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error {
			if err := args(cmd, a); err != nil {
				return exitError(usage(err))
			}
			return nil
		}
	}
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, a []string) error { return exitError(run(cmd, a)) }
	}
	for _, sub := range c.Commands() {
		withExitCodes(sub)
	}
}

func exitError(err error) error {
	code := ExitCode(err)
	if code == ExitOK {
		return nil
	}
	var exit *config.ExitError
	if errors.As(err, &exit) {
		return err
	}
	if code == ExitSchema && !errors.Is(err, errSchemaMissing) {
		err = errors.Join(errSchemaMissing, err)
	}
	return &config.ExitError{Code: code, Err: err}
}
