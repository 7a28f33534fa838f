package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/campaign/campaigntest"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/testenv"
)

// runCampaign runs `nudgectl campaign ARGS` through the real command tree
// and returns its output and error.
func runCampaign(t *testing.T, dbURL string, args ...string) (string, error) {
	t.Helper()
	cmd := Command()
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	config.BindEnv(cmd)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(append([]string{"campaign"}, args...), "--database-url", dbURL))
	err := cmd.Execute()
	return out.String(), err
}

// statusJSON is `campaign status --json` decoded into the report.
func statusJSON(t *testing.T, dbURL string, args ...string) campaign.Report {
	t.Helper()
	var r campaign.Report
	require.NoError(t, json.Unmarshal([]byte(runStatus(t, dbURL, append(args, "--json")...)), &r))
	return r
}

// A shadow campaign and real runs over the same source, planned for real:
// the shadow run's status shows its intended counts per slice, then, once
// a real run exists, both side by side and whether each slice matches; a
// real run's status shows its shadow run; --compare names another; the
// measured slice time is shown. Not parallel: runStatus is shared with a
// test that stands in for a terminal.
func TestCampaignStatusShowsShadowCountsBesideARealRun(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	env := campaigntest.New(t, db, clock.Real{}) // real: the slices' time is measured
	env.Audience(t, "acme", "renewals", 450, 7, 300)
	due := now.Add(time.Hour)
	shadow, _, err := campaign.Create(ctx, db.Pool, campaign.Spec{Tenant: "acme", Name: "preview", Channel: "email",
		Template: "renewal", Source: "renewals", DueAt: &due, Deadline: due.Add(24 * time.Hour), SliceSize: 200,
		Shadow: true})
	require.NoError(t, err)
	require.Equal(t, []campaign.Verdict{campaign.PlanSlice, campaign.PlanSlice, campaign.PlanSlice}, env.Plan(t, shadow, 3))

	// No real run yet: the shadow run's own intended counts.
	r := statusJSON(t, db.URL, fmt.Sprint(shadow))
	require.True(t, r.Shadow)
	require.Equal(t, campaign.Done, r.State)
	require.EqualValues(t, 448, r.Planned, "450 rows, 2 without an address")
	require.EqualValues(t, 0, r.Deliveries["pending"], "a shadow run creates no reminder")
	require.EqualValues(t, 3, r.SlicesMeasured)
	require.NotNil(t, r.SliceMSMedian)
	require.NotNil(t, r.SliceMSP95)
	require.GreaterOrEqual(t, *r.SliceMSP95, *r.SliceMSMedian)
	c := r.Comparison
	require.NotNil(t, c)
	require.Nil(t, c.RealID)
	require.Equal(t, "none", c.Chosen)
	require.Equal(t, shadow, c.ShadowID)
	require.EqualValues(t, 3, c.Slices)
	require.EqualValues(t, 448, c.ShadowIntents)
	require.EqualValues(t, 450, c.ShadowRows)
	require.EqualValues(t, 2, c.ShadowBad)
	require.Len(t, c.PerSlice, 3)
	require.Equal(t, []int{200, 200, 50}, []int{*c.PerSlice[0].ShadowRows, *c.PerSlice[1].ShadowRows, *c.PerSlice[2].ShadowRows})
	require.Equal(t, []int{199, 199, 50}, []int{*c.PerSlice[0].ShadowIntents, *c.PerSlice[1].ShadowIntents, *c.PerSlice[2].ShadowIntents})
	require.Nil(t, c.PerSlice[0].RealRows)
	text := runStatus(t, db.URL, fmt.Sprint(shadow))
	require.Contains(t, text, "done, a shadow run: it creates no reminders\n")
	require.Contains(t, text, "planned: 448 (intended)\n")
	require.Regexp(t, `slice time: median \d+ ms, p95 \d+ ms \(3 slices measured\)\n`, text)
	require.Contains(t, text, "shadow counts: 3 slices, 450 rows read, 448 intended reminders, 2 bad rows; no real run")
	require.Contains(t, text, "1      200/199/1              -/-/-")
	require.Contains(t, text, "3      50/50/0                -/-/-")

	// The real run: the same counts, slice by slice, from either side.
	real := env.Create(t, "acme", "spring", "renewals", 200, due)
	env.Plan(t, real, 3)
	r = statusJSON(t, db.URL, fmt.Sprint(shadow))
	c = r.Comparison
	require.NotNil(t, c.RealID)
	require.Equal(t, real, *c.RealID)
	require.Equal(t, "latest", c.Chosen)
	require.True(t, c.Same)
	require.EqualValues(t, 0, c.SlicesDiffer)
	require.EqualValues(t, 448, c.RealIntents)
	require.Equal(t, 199, *c.PerSlice[0].RealIntents)
	text = runStatus(t, db.URL, fmt.Sprint(shadow))
	require.Contains(t, text, fmt.Sprintf("shadow %d vs real %d (the latest over the same tenant, source and slice size): "+
		"3 slices, every slice matches; intents 448 vs 448, rows 450 vs 450, bad rows 2 vs 2\n", shadow, real))
	require.Contains(t, text, "1      200/199/1              200/199/1              same\n")
	r = statusJSON(t, db.URL, fmt.Sprint(real))
	require.False(t, r.Shadow)
	require.Equal(t, shadow, r.Comparison.ShadowID, "a real run's status shows its shadow run")
	require.Equal(t, real, *r.Comparison.RealID)
	require.True(t, r.Comparison.Same)

	// A later real run that differs (a learner lost their address) is the
	// latest: one slice differs; --compare names the first again.
	_, err = db.Pool.Exec(ctx, `UPDATE audience_renewals SET email = NULL WHERE id = 250`)
	require.NoError(t, err)
	changed := env.Create(t, "acme", "changed", "renewals", 200, due)
	env.Plan(t, changed, 3)
	r = statusJSON(t, db.URL, fmt.Sprint(shadow))
	require.Equal(t, changed, *r.Comparison.RealID)
	require.False(t, r.Comparison.Same)
	require.EqualValues(t, 1, r.Comparison.SlicesDiffer)
	require.EqualValues(t, 447, r.Comparison.RealIntents)
	require.False(t, r.Comparison.PerSlice[1].Same)
	text = runStatus(t, db.URL, fmt.Sprint(shadow))
	require.Contains(t, text, "3 slices, 1 of them differ; intents 448 vs 447")
	require.Contains(t, text, "2      200/199/1              200/198/2              DIFFERS\n")
	r = statusJSON(t, db.URL, fmt.Sprint(shadow), "--compare", fmt.Sprint(real))
	require.Equal(t, "named", r.Comparison.Chosen)
	require.Equal(t, real, *r.Comparison.RealID)
	require.True(t, r.Comparison.Same)

	// Two real runs are not a shadow run and a real one; a campaign with
	// a slice size of its own is compared only with the same size.
	out, err := runCampaign(t, db.URL, "status", fmt.Sprint(real), "--compare", fmt.Sprint(changed))
	require.ErrorIs(t, err, campaign.ErrNotComparable, out)
	require.ErrorContains(t, err, "both are real runs")
	other := env.Create(t, "acme", "other-size", "renewals", 100, due)
	require.Nil(t, statusJSON(t, db.URL, fmt.Sprint(other)).Comparison)
}

// `campaign rates` stores what the web tier's create is admitted with,
// computed from the limits file, and shows it.
func TestCampaignRatesStoresTheLimitsFile(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	out, err := runCampaign(t, db.URL, "rates")
	require.NoError(t, err)
	require.Contains(t, out, "no campaign admission rates stored")
	limits := filepath.Join(t.TempDir(), "limits.json")
	require.NoError(t, os.WriteFile(limits, []byte(`{"version": "v7", "channels": {
		"email": {"account": "ses", "rate": 10, "burst": 10,
		          "tenants": {"acme": {"rate": 2, "burst": 1}, "default": {"rate": 5, "burst": 1}}}}}`), 0o600))
	out, err = runCampaign(t, db.URL, "rates", "--limits", limits, "--max-attempts", "3", "--actor", "ops")
	require.NoError(t, err, out)
	require.Contains(t, out, "by ops from "+limits+" (version v7)\n")
	require.Contains(t, out, "retries: 3s (3 attempts, backoff 1s doubling to at most 1h0m0s)\n")
	require.Contains(t, out, "planner slice size: 200\n")
	require.Regexp(t, `email +acme +2  tenant "acme" on channel email in `, out)
	require.Regexp(t, `email +\(others\) +5  the default tenant allowance on channel email in `, out)
	require.Regexp(t, `sms +\(others\) +no limit  no limit for channel "sms"`, out)
	_, err = runCampaign(t, db.URL, "rates", "--limits", filepath.Join(t.TempDir(), "missing.json"))
	require.ErrorContains(t, err, "--limits")
	out, err = runCampaign(t, db.URL, "rates")
	require.NoError(t, err)
	require.Contains(t, out, "version v7", "a bad file leaves the stored rates as they were")
}
