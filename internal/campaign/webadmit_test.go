package campaign_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/testenv"
)

// The web tier's admission rule (nudge_campaign_admit) is Admit: both run
// on the same inputs and agree on every number and the verdict, at the
// edges too (exactly enough, one nanosecond short, a due time after
// planning, fractional rates and row times, an empty audience, an override).
func TestAdmitInSQLIsAdmit(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	now := time.Date(2026, 12, 1, 9, 0, 0, 123456000, time.UTC)
	base := campaign.AdmissionInput{Now: now, Deadline: now.Add(time.Hour), Audience: 40_000, AudienceFrom: "counted",
		SliceSize: 200, RowTime: time.Millisecond, RowTimeFrom: "measured", Rate: 50, RateFrom: "limits",
		Retry: 15 * time.Second, RetryFrom: "5 attempts"}
	with := func(f func(*campaign.AdmissionInput)) campaign.AdmissionInput { in := base; f(&in); return in }
	// base needs 90 s + 800 s + 15 s = 905 s.
	cases := map[string]campaign.AdmissionInput{
		"covered":        base,
		"exactly enough": with(func(in *campaign.AdmissionInput) { in.Deadline = now.Add(905 * time.Second) }),
		"one microsecond short": with(func(in *campaign.AdmissionInput) {
			in.Deadline = now.Add(905*time.Second - time.Microsecond)
		}),
		"a due time after planning":  with(func(in *campaign.AdmissionInput) { in.DeliveryFrom = now.Add(50 * time.Minute) }),
		"a due time before planning": with(func(in *campaign.AdmissionInput) { in.DeliveryFrom = now.Add(time.Second) }),
		"no rate limit":              with(func(in *campaign.AdmissionInput) { in.Rate = 0; in.Deadline = now.Add(106 * time.Second) }),
		"a fractional rate":          with(func(in *campaign.AdmissionInput) { in.Rate = 7.3; in.Audience = 40_001 }),
		"a measured row time":        with(func(in *campaign.AdmissionInput) { in.RowTime = 1234567 * time.Nanosecond }),
		"slice size 1":               with(func(in *campaign.AdmissionInput) { in.SliceSize = 1; in.Audience = 999 }),
		"an empty audience":          with(func(in *campaign.AdmissionInput) { in.Audience = 0 }),
		"a past deadline":            with(func(in *campaign.AdmissionInput) { in.Deadline = now.Add(-time.Second) }),
		"an override": with(func(in *campaign.AdmissionInput) {
			in.Deadline = now.Add(time.Minute)
			in.Override = "the board"
		}),
		"a million rows": with(func(in *campaign.AdmissionInput) { in.Audience = 1_000_000; in.Deadline = now.Add(48 * time.Hour) }),
	}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			want := campaign.Admit(in)
			got, err := campaign.AdmitInSQL(context.Background(), db.Pool, in)
			require.NoError(t, err)
			require.Equal(t, want.Admitted, got.Admitted, "verdict\nGo:\n%s", want)
			require.Equal(t, []any{want.Slices, want.SliceTime, want.Planning, want.Delivery, want.Need, want.Window},
				[]any{got.Slices, got.SliceTime, got.Planning, got.Delivery, got.Need, got.Window},
				"slices, slice time, planning, delivery, need, window")
			require.True(t, want.Finish.Truncate(time.Microsecond).Equal(got.Finish), "finish %s, want %s", got.Finish, want.Finish)
			require.Equal(t, want.AdmissionInput.Override, got.Override)
			require.Equal(t, want.RateFrom, got.RateFrom)
		})
	}
}

// The web tier's nudge_campaign_create is admission-checked: without
// stored rates it is judged as `nudgectl campaign create` without
// --limits; with the rates an operator stored from the limits file, as
// Assess judges it with that file; a refusal is SQLSTATE NC001 with every
// number; p_admit_anyway creates it regardless, recorded.
func TestWebTierCreateIsAdmissionChecked(t *testing.T) {
	t.Parallel()
	b := setup(t, 1000)
	ctx := context.Background()
	web, login, _ := b.login(t, "nudge_intake")
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO nudge_intake_tenants (grantee, tenant) VALUES ($1, 'acme')`, login)
	require.NoError(t, err)
	operator, _, _ := b.login(t, "nudge_operator")

	create := func(name string, window time.Duration, override any) (int64, error) {
		now := time.Now()
		var (
			id      int64
			created bool
		)
		err := web.QueryRow(ctx, `
			SELECT id, created FROM nudge_campaign_create('acme', $1, 'email', 'renewal', 'renewals', $2, NULL, $3, 200, NULL,
			                                              p_admit_anyway => $4)`,
			name, now, now.Add(window), override).Scan(&id, &created)
		return id, err
	}
	refusal := func(err error) *pgconn.PgError {
		t.Helper()
		var pgErr *pgconn.PgError
		require.True(t, errors.As(err, &pgErr), "want a refusal, got %v", err)
		require.Equal(t, campaign.NotAdmittedCode, pgErr.Code, pgErr.Message)
		return pgErr
	}
	admission := func(id int64) campaign.Admission {
		t.Helper()
		var raw []byte
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT admission FROM campaigns WHERE id = $1`, id).Scan(&raw))
		var a campaign.Admission
		require.NoError(t, json.Unmarshal(raw, &a), "%s", raw)
		return a
	}

	// No rates stored: 1000 rows / 200 = 5 slices × (10 ms × 200 + 250 ms)
	// = 11.25 s, no delivery budget, the workers' default retries 15 s.
	_, err = create("too-soon", 20*time.Second, nil)
	e := refusal(err)
	for _, want := range []string{`campaign 'too-soon' of tenant 'acme' not admitted`,
		"planning 11.250 s: 1000 audience rows (counted in the source) / slice size 200 = 5 slices × 2.250 s (10.000 ms per row, the default: 0 measured slices, 10 needed",
		"delivery 0 s: no rate limit (no rates stored", "retries 15.000 s: 5 attempts", "needs 26.250 s"} {
		require.Contains(t, e.Message, want)
	}
	require.Equal(t, int64(0), b.count(t, `SELECT count(*) FROM campaigns WHERE name = 'too-soon'`), "a refusal creates nothing")
	id, err := create("in-time", 40*time.Second, nil)
	require.NoError(t, err)
	a := admission(id)
	require.True(t, a.Admitted)
	require.Equal(t, 26250*time.Millisecond, a.Need)

	// The operator stores the limits file: acme's email allowance is 2/s.
	limits := filepath.Join(t.TempDir(), "limits.json")
	require.NoError(t, os.WriteFile(limits, []byte(`{"version": "v1", "channels": {
		"email": {"account": "ses", "rate": 10, "burst": 10,
		          "tenants": {"acme": {"rate": 2, "burst": 1}, "default": {"rate": 5, "burst": 1}}}}}`), 0o600))
	l, err := ratelimit.Load(limits)
	require.NoError(t, err)
	budget := campaign.Budget{Limits: l, LimitsFrom: limits, MaxAttempts: 3, BackoffBase: time.Second,
		BackoffMax: time.Hour, SliceSize: 200}
	_, _, err = campaign.StoreRates(ctx, operator, budget, "test", time.Now())
	require.NoError(t, err)
	_, rates, ok, err := campaign.ReadRates(ctx, operator)
	require.NoError(t, err)
	require.True(t, ok)
	require.Contains(t, rates, campaign.StoredRate{Channel: "email", Tenant: "acme", Rate: 2,
		From: `tenant "acme" on channel email in ` + limits})
	require.Contains(t, rates, campaign.StoredRate{Channel: "email", Tenant: campaign.OtherTenants, Rate: 5,
		From: "the default tenant allowance on channel email in " + limits})

	// 11.25 s + 1000 / 2 = 500 s + retries 1 + 2 = 3 s: 514.25 s.
	_, err = create("five-minutes", 5*time.Minute, nil)
	e = refusal(err)
	require.Contains(t, e.Message, `delivery 500.000 s: 1000 reminders / 2 sends per second (tenant "acme" on channel email in `+limits+")")
	require.Contains(t, e.Message, "retries 3.000 s: 3 attempts, backoff 1s doubling to at most 1h0m0s")
	require.Contains(t, e.Message, "needs 514.250 s")
	require.Contains(t, e.Detail, `"admitted": false`)
	id, err = create("ten-minutes", 10*time.Minute, nil)
	require.NoError(t, err)

	// The same numbers as nudgectl campaign create with the same file.
	got := admission(id)
	due := got.Now
	want, err := campaign.Assess(ctx, b.db.Pool, campaign.Spec{Tenant: "acme", Channel: "email", Source: "renewals",
		DueAt: &due, Deadline: got.Deadline, SliceSize: 200}, budget, got.Now)
	require.NoError(t, err)
	require.Equal(t, []any{want.Audience, want.SliceSize, want.RowTime, want.RowTimeFrom, want.Rate, want.RateFrom, want.Retry,
		want.RetryFrom, want.Slices, want.Planning, want.Delivery, want.Need, want.Admitted},
		[]any{got.Audience, got.SliceSize, got.RowTime, got.RowTimeFrom, got.Rate, got.RateFrom, got.Retry,
			got.RetryFrom, got.Slices, got.Planning, got.Delivery, got.Need, got.Admitted})

	// An override creates it, recorded with the numbers.
	id, err = create("approved", time.Minute, "the board approved it")
	require.NoError(t, err)
	a = admission(id)
	require.True(t, a.Admitted)
	require.Equal(t, "the board approved it", a.Override)
	require.Equal(t, 500*time.Second, a.Delivery)

	// Operators bring their own admission (nudgectl's), as before.
	due = time.Now()
	_, created, err := campaign.Create(ctx, operator, campaign.Spec{Tenant: "acme", Name: "by-operator", Channel: "email",
		Template: "renewal", Source: "renewals", DueAt: &due, Deadline: due.Add(time.Minute), SliceSize: 200})
	require.NoError(t, err)
	require.True(t, created)
}
