package campaign

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/nudgehq/nudge/internal/pg"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// The web tier's admission (schema 29): nudge_campaign_create admits a
// campaign created by a login that may not write reminders itself with
// nudge_campaign_admit, the rule of Admit in SQL, over the rates and the
// retry budget an operator stored with StoreRates.

// NotAdmittedCode is the SQLSTATE with which nudge_campaign_create refuses
// a web tier's campaign its window cannot cover.
const NotAdmittedCode = "NC001"

// OtherTenants is the tenant of the stored rate that applies to every
// tenant without a rate of its own.
const OtherTenants = ""

// StoredRate is the sends per second of a channel for a tenant (OtherTenants:
// every other one; 0: no limit), as the web tier's admission reads it.
type StoredRate struct {
	Channel, Tenant string
	Rate            float64
	From            string
}

// StoredBudget is what StoreRates stored: where the rates come from, the
// retry budget and the planner's slice size.
type StoredBudget struct {
	LimitsFrom, LimitsVersion string
	Retry                     time.Duration
	RetryFrom                 string
	SliceSize                 int
	StoredAt                  time.Time
	StoredBy                  string
}

// Rates computes what StoreRates stores from b (its Limits, LimitsFrom,
// retry policy and SliceSize): per channel, the rate of every tenant the
// limits file names and of every other tenant, with the same function (rate)
// that Assess uses, and the retry budget of retryBudget.
func Rates(b Budget) ([]StoredRate, StoredBudget) {
	var out []StoredRate
	for _, ch := range reminder.Channels {
		c := string(ch)
		tenants := []string{OtherTenants}
		for t := range b.Limits.Channels[c].Tenants {
			if t != "default" {
				tenants = append(tenants, t)
			}
		}
		slices.Sort(tenants)
		for _, t := range tenants {
			r, from := rate(b.Limits, c, t)
			if b.LimitsFrom != "" {
				from += " in " + b.LimitsFrom
			}
			out = append(out, StoredRate{Channel: c, Tenant: t, Rate: r, From: from})
		}
	}
	retry, retryFrom := retryBudget(b.MaxAttempts, b.BackoffBase, b.BackoffMax)
	size := b.SliceSize
	if size <= 0 {
		size = DefaultSliceSize
	}
	from := b.LimitsFrom
	if from == "" {
		from = "no limits file"
	}
	return out, StoredBudget{LimitsFrom: from, LimitsVersion: b.Limits.Version, Retry: retry, RetryFrom: retryFrom,
		SliceSize: size}
}

// StoreRates replaces the web tier's admission budget with the one of b, in
// one transaction, as q's login (nudge_operator).
func StoreRates(ctx context.Context, q pg.Beginner, b Budget, by string, now time.Time) (StoredBudget, []StoredRate, error) {
	rates, sb := Rates(b)
	sb.StoredAt, sb.StoredBy = now, by
	err := pgx.BeginFunc(ctx, q, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, query("RatesClear")); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, query("RatesBudget"), sb.LimitsFrom, sb.LimitsVersion, int64(sb.Retry), sb.RetryFrom,
			sb.SliceSize, now, by); err != nil {
			return err
		}
		var chans, tenants, froms []string
		var rs []float64
		for _, r := range rates {
			chans, tenants, rs, froms = append(chans, r.Channel), append(tenants, r.Tenant), append(rs, r.Rate), append(froms, r.From)
		}
		_, err := tx.Exec(ctx, query("RatesInsert"), chans, tenants, rs, froms)
		return err
	})
	if err != nil {
		return StoredBudget{}, nil, fmt.Errorf("storing the campaign admission rates: %w", err)
	}
	return sb, rates, nil
}

// ReadRates reads the stored admission budget (ok false: none stored).
func ReadRates(ctx context.Context, q pg.Querier) (b StoredBudget, rates []StoredRate, ok bool, err error) {
	var retry int64
	err = q.QueryRow(ctx, query("RatesBudgetRead")).Scan(&b.LimitsFrom, &b.LimitsVersion, &retry, &b.RetryFrom,
		&b.SliceSize, &b.StoredAt, &b.StoredBy)
	if errors.Is(err, pgx.ErrNoRows) {
		return StoredBudget{}, nil, false, nil
	}
	if err != nil {
		return StoredBudget{}, nil, false, fmt.Errorf("reading the campaign admission budget: %w", err)
	}
	b.Retry = time.Duration(retry)
	rows, err := q.Query(ctx, query("RatesRead"))
	if err != nil {
		return StoredBudget{}, nil, false, fmt.Errorf("reading the campaign admission rates: %w", err)
	}
	rates, err = pgx.CollectRows(rows, pgx.RowToStructByPos[StoredRate])
	if err != nil {
		return StoredBudget{}, nil, false, fmt.Errorf("reading the campaign admission rates: %w", err)
	}
	return b, rates, true, nil
}

// AdmitInSQL decides in with nudge_campaign_admit, the web tier's rule: the
// tests run it beside Admit on the same inputs, so the two stay one rule.
func AdmitInSQL(ctx context.Context, q pg.Querier, in AdmissionInput) (Admission, error) {
	js, err := json.Marshal(in)
	if err != nil {
		return Admission{}, fmt.Errorf("admission input: %w", err)
	}
	var out []byte
	if err := q.QueryRow(ctx, query("AdmitSQL"), string(js)).Scan(&out); err != nil {
		return Admission{}, fmt.Errorf("nudge_campaign_admit: %w", err)
	}
	var a Admission
	if err := json.Unmarshal(out, &a); err != nil {
		return Admission{}, fmt.Errorf("nudge_campaign_admit's answer %s: %w", out, err)
	}
	return a, nil
}
