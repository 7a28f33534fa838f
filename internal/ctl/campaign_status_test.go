package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/campaign/campaigntest"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/config"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/intake"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// runStatus runs `nudgectl campaign status` through the real command tree.
func runStatus(t *testing.T, dbURL string, args ...string) string {
	t.Helper()
	cmd := Command()
	cmd.SilenceUsage = true
	config.BindEnv(cmd)
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append(append([]string{"campaign", "status"}, args...), "--database-url", dbURL))
	require.NoError(t, cmd.Execute(), errOut.String())
	return out.String()
}

// The status of a campaign planned for real, as JSON and as text with and
// without a terminal; its deliveries count its own reminders only.
// Not parallel: it stands in for a terminal (isTerminal).
func TestCampaignStatusOfAPlannedCampaign(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	clk := clock.NewFake(now)
	env := campaigntest.New(t, db, clk)
	env.Audience(t, "acme", "renewals", 450, 7, 300)
	id := env.Create(t, "acme", "spring", "renewals", 200, now.Add(time.Hour))
	require.Equal(t, []campaign.Verdict{campaign.PlanSlice, campaign.PlanSlice}, env.Plan(t, id, 2))

	// Three of its reminders canceled; reminders that only look like its
	// own: another tenant's with its key, and campaign 1<id>'s prefix.
	for _, k := range []int{1, 2, 3} {
		_, err := db.Pool.Exec(ctx, `SELECT nudge_cancel('acme', $1)`, fmt.Sprintf("campaign:%d:%d", id, k))
		require.NoError(t, err)
	}
	for _, r := range []struct{ tenant, key string }{
		{"globex", fmt.Sprintf("campaign:%d:1", id)},
		{"acme", fmt.Sprintf("campaign:%d0:1", id)},
		{"acme", fmt.Sprintf("campaign:%d", id)},
	} {
		_, err := intake.Schedule(ctx, db.Pool, intake.Request{Tenant: r.tenant, Key: r.key, Channel: reminder.Email,
			Recipient: "x@example.org", Template: "t", DueAt: now.Add(time.Hour), Deadline: now.Add(2 * time.Hour)})
		require.NoError(t, err)
	}

	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(runStatus(t, db.URL, fmt.Sprint(id), "--json")), &got))
	require.Equal(t, "planning", got["state"])
	require.EqualValues(t, 398, got["planned"], "400 rows read, 2 without an address")
	require.EqualValues(t, 2, got["bad_rows"])
	require.EqualValues(t, 50, got["remaining"])
	require.EqualValues(t, 2, got["slices_done"])
	require.EqualValues(t, 200, got["slice_size"])
	require.EqualValues(t, 0, got["late_slices"])
	require.Nil(t, got["unplanned"])
	require.NotNil(t, got["last_checkpoint"])
	require.GreaterOrEqual(t, got["checkpoint_lag_seconds"], 0.0)
	deliveries := got["deliveries"].(map[string]any)
	require.Len(t, deliveries, len(reminder.States), "every state, zeros included")
	require.EqualValues(t, 395, deliveries["pending"])
	require.EqualValues(t, 3, deliveries["canceled"])
	require.EqualValues(t, 0, deliveries["delivered"])

	// The web tier's function: the same figures, for its own tenants only.
	web, _ := login(t, db, "nudge_intake", "acme")
	var (
		state, byState       string
		planned, bad, slices int64
	)
	require.NoError(t, web.QueryRow(ctx, `SELECT state, planned, bad, slices, deliveries::text FROM nudge_campaign_status('acme', $1)`, id).
		Scan(&state, &planned, &bad, &slices, &byState))
	require.Equal(t, []any{"planning", int64(398), int64(2), int64(2)}, []any{state, planned, bad, slices})
	require.JSONEq(t, `{"pending": 395, "canceled": 3}`, byState)
	_, err := web.Exec(ctx, `SELECT * FROM nudge_campaign_status('globex', $1)`, id)
	require.ErrorContains(t, err, "may not act for tenant 'globex'")
	_, err = web.Exec(ctx, `SELECT * FROM nudge_campaign_status('acme', $1)`, id+1)
	require.ErrorContains(t, err, "has no campaign")

	// An operator not granted the audience: the remainder estimated from
	// the source's row count once PostgreSQL has one, unknown before.
	_, operator := login(t, db, "nudge_operator", "")
	var asOperator map[string]any
	require.NoError(t, json.Unmarshal([]byte(runStatus(t, operator, fmt.Sprint(id), "--json")), &asOperator))
	require.Nil(t, asOperator["remaining"])
	require.Equal(t, false, asOperator["remaining_estimated"])
	require.Contains(t, asOperator["remaining_error"], "permission denied")
	require.EqualValues(t, 398, asOperator["planned"])
	_, err = db.Pool.Exec(ctx, `ANALYZE audience_renewals`)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(runStatus(t, operator, fmt.Sprint(id), "--json")), &asOperator))
	require.EqualValues(t, 50, asOperator["remaining"])
	require.Equal(t, true, asOperator["remaining_estimated"])
	require.Contains(t, runStatus(t, operator, fmt.Sprint(id)), "remaining: ~50 (estimated from the source's row count: ")

	text := runStatus(t, db.URL, fmt.Sprint(id))
	require.NotContains(t, text, "[", "no progress bar when stdout is not a terminal")
	require.Contains(t, text, "planned: 398\n")
	require.Contains(t, text, "remaining: 50\n")
	require.Contains(t, text, "slices done: 2 (slice size 200, lease 30s)\n")
	require.Contains(t, text, "pending 395, ")
	require.Contains(t, text, "canceled 3\n")

	isTerminal = func(io.Writer) bool { return true }
	t.Cleanup(func() { isTerminal = isTerminalFile })
	text = runStatus(t, db.URL, fmt.Sprint(id))
	require.Contains(t, text, "\n[###################################.....]  88.9% 400/450 rows\n")

	// The deadline passes mid-plan: the campaign ends late, the remainder
	// counted in rows and in slices.
	clk.Advance(26 * time.Hour)
	require.Equal(t, []campaign.Verdict{campaign.EndLate}, env.Plan(t, id, 1))
	require.NoError(t, json.Unmarshal([]byte(runStatus(t, db.URL, fmt.Sprint(id), "--json")), &got))
	require.Equal(t, "late", got["state"])
	require.EqualValues(t, 50, got["unplanned"])
	require.EqualValues(t, 1, got["late_slices"])
	require.EqualValues(t, 0, got["remaining"])
	require.Nil(t, got["checkpoint_lag_seconds"], "no lag once the campaign ended")
	var unplanned, lateSlices int64
	require.NoError(t, web.QueryRow(ctx, `SELECT state, unplanned, late_slices FROM nudge_campaign_status('acme', $1)`, id).
		Scan(&state, &unplanned, &lateSlices))
	require.Equal(t, []any{"late", int64(50), int64(1)}, []any{state, unplanned, lateSlices})
	text = runStatus(t, db.URL, fmt.Sprint(id))
	require.Contains(t, text, "\n[###################################.....]  88.9% 400/450 rows\n", "the bar shows what was left")
	require.Contains(t, text, "late slices: 1 (unplanned rows: 50)\n")
}

// login is a login of group for this test, and its URL; an intake login is
// allowed tenant only.
func login(t *testing.T, db *testenv.DB, group, tenant string) (*pgxpool.Pool, string) {
	t.Helper()
	pool, name, u := db.Login(t, group)
	if group == "nudge_intake" {
		_, err := db.Pool.Exec(context.Background(), `INSERT INTO nudge_intake_tenants (grantee, tenant) VALUES ($1, $2)`, name, tenant)
		require.NoError(t, err)
	}
	return pool, u
}
