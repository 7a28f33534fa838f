package campaign

import (
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/nudgehq/nudge/internal/metrics"
)

// Outcome names what handling one planning command came to, for
// nudge_campaign_slices_total{outcome}, and for a duplicate its kind
// (nudge_campaign_duplicates_suppressed_total{kind}).
func Outcome(d Decision, err error) (outcome, dupKind string) {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, ErrPoison):
		return metrics.SlicePoison, ""
	case errors.Is(err, ErrDeferred) || d.Verdict == Defer:
		return metrics.SliceDeferred, ""
	case errors.As(err, &pgErr) && (pgErr.Code == "57014" || pgErr.Code == "25P03"):
		// query_canceled (statement_timeout) or
		// idle_in_transaction_session_timeout: the slice outlived its lease.
		return metrics.SliceLeaseExpired, ""
	case err != nil:
		return metrics.SliceFailed, ""
	}
	switch d.Verdict {
	case PlanSlice:
		return metrics.SlicePlanned, ""
	case EndLate:
		return metrics.SliceLate, ""
	case Republish:
		return metrics.SliceRepublished, ""
	case Drop:
		// Decide's reasons for a fence that is not the campaign's.
		switch {
		case strings.Contains(d.Reason, " is stale"):
			return metrics.SliceDuplicate, metrics.PlanDupStale
		case strings.Contains(d.Reason, " is ahead"):
			return metrics.SliceDuplicate, metrics.PlanDupAhead
		}
	}
	return metrics.SliceInactive, ""
}

// observe records one command's outcome and how long it took.
func (p *Planner) observe(d Decision, err error, took time.Duration) {
	outcome, kind := Outcome(d, err)
	p.Metrics.Slice(outcome, kind, took)
}
