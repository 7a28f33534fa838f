package campaign

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/pg"
)

// EveryTenant is the cohort entry that enables campaigns for every tenant
// (schema 25 starts with it).
const EveryTenant = "*"

// Cohort lists the tenants whose campaigns may be created and planned
// (EveryTenant: all), sorted.
func Cohort(ctx context.Context, q pg.Querier) ([]string, error) {
	rows, err := q.Query(ctx, query("Cohort"))
	if err != nil {
		return nil, fmt.Errorf("reading the campaign cohort: %w", err)
	}
	ts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("reading the campaign cohort: %w", err)
	}
	return ts, nil
}

// SetCohort makes tenants the whole cohort, in one statement: campaigns
// of other tenants are refused at create, and those already planning wait
// (their commands are dropped and the cron does not nudge them) until their
// tenant is back. by is recorded for the tenants added.
func SetCohort(ctx context.Context, q pg.Querier, tenants []string, by string) error {
	if len(tenants) == 0 {
		return fmt.Errorf("the campaign cohort needs at least one tenant (or %q for every tenant)", EveryTenant)
	}
	for _, t := range tenants {
		if t == "" {
			return fmt.Errorf("the campaign cohort: an empty tenant name")
		}
	}
	if _, err := q.Exec(ctx, query("CohortSet"), slices.Compact(slices.Sorted(slices.Values(tenants))), by); err != nil {
		return fmt.Errorf("setting the campaign cohort: %w", err)
	}
	return nil
}

// ChangeCohort adds (add true) or removes tenants from the cohort.
func ChangeCohort(ctx context.Context, q pg.Querier, tenants []string, add bool, by string) error {
	name := "CohortRemove"
	if add {
		name = "CohortAdd"
	}
	if _, err := q.Exec(ctx, query(name), tenants, by); err != nil {
		return fmt.Errorf("changing the campaign cohort: %w", err)
	}
	return nil
}

// SliceComparison is one slice of a shadow campaign beside the same slice
// of another campaign (nudge_campaign_shadow_compare); nil: the campaign
// has no such slice.
type SliceComparison struct {
	Slice         int64 `json:"slice"`
	ShadowRows    *int  `json:"shadow_rows"`
	ShadowIntents *int  `json:"shadow_intents"`
	ShadowBad     *int  `json:"shadow_bad"`
	RealRows      *int  `json:"real_rows"`
	RealIntents   *int  `json:"real_intents"`
	RealBad       *int  `json:"real_bad"`
	Same          bool  `json:"same"`
}

// CompareShadow returns, per slice, the counts of shadow campaign shadow
// beside those of campaign real (a real run over the same source and slice
// size). It is what `campaign status` shows beside a real run's counts.
func CompareShadow(ctx context.Context, q pg.Querier, shadow, real int64) ([]SliceComparison, error) {
	rows, err := q.Query(ctx, query("CompareShadow"), shadow, real)
	if err != nil {
		return nil, fmt.Errorf("comparing campaign %d with %d: %w", shadow, real, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[SliceComparison])
	if err != nil {
		return nil, fmt.Errorf("comparing campaign %d with %d: %w", shadow, real, err)
	}
	return out, nil
}
