package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/campaign/campaigntest"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/console"
	"github.com/nudgehq/nudge/internal/testenv"
)

// A shadow campaign's page says it is a shadow run and shows its intended
// total beside the real run's, and whether every slice matches; both pages
// show the measured slice time.
func TestCampaignPageShowsShadowBesideReal(t *testing.T) {
	t.Parallel()
	db := testenv.Postgres(t)
	ctx := context.Background()
	env := campaigntest.New(t, db, clock.Real{})
	env.Audience(t, "acme", "renewals", 450, 7, 300)
	due := time.Now().Add(time.Hour)
	shadow, _, err := campaign.Create(ctx, db.Pool, campaign.Spec{Tenant: "acme", Name: "preview", Channel: "email",
		Template: "renewal", Source: "renewals", DueAt: &due, Deadline: due.Add(24 * time.Hour), SliceSize: 200,
		Shadow: true})
	require.NoError(t, err)
	env.Plan(t, shadow, 3)

	srv, err := console.New(console.Config{Token: token}, console.Deps{DB: db.Pool,
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	require.NoError(t, err)
	web := httptest.NewServer(srv)
	t.Cleanup(web.Close)
	page := func(id int64) string {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, web.URL+"/campaigns/"+itoa(id), nil)
		require.NoError(t, err)
		req.SetBasicAuth("alice", token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		return string(body)
	}
	body := page(shadow)
	require.Contains(t, body, `<b id="shadow">shadow run</b>`)
	require.Contains(t, body, "448 intended over 3 slices; no real run")
	require.Regexp(t, `id="slice-time">median \d+ ms, p95 \d+ ms \(3 slices measured\)<`, body)

	real := env.Create(t, "acme", "spring", "renewals", 200, due)
	env.Plan(t, real, 3)
	body = page(shadow)
	require.Contains(t, body, "448 intended, real <a href=\"/campaigns/"+itoa(real)+"\">")
	require.Contains(t, body, ">"+itoa(real)+"</a>: 448 planned, over 3 slices: <b>every slice matches</b>")
	body = page(real)
	require.NotContains(t, body, `id="shadow"`)
	require.Contains(t, body, "<b>every slice matches</b>", "a real run's page shows its shadow run")
}
