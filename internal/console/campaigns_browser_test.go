package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/internal/campaign/campaigntest"
	"github.com/nudgehq/nudge/internal/clock"
	"github.com/nudgehq/nudge/internal/console"
	"github.com/nudgehq/nudge/internal/testenv"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// TestCampaignPagesInABrowser plans a campaign for real (two slices of 200
// of 450 rows, two without an address), cancels three of its reminders,
// and reads it in headless Chromium: the list, its status page (the same
// figures as `nudgectl campaign status`) and the link to its reminders. The
// pages are read-only: they answer GET only, behind the sign-in.
func TestCampaignPagesInABrowser(t *testing.T) {
	exe := chromium(t)
	db := testenv.Postgres(t)
	ctx := context.Background()
	env := campaigntest.New(t, db, clock.Real{})
	env.Audience(t, "acme", "renewals", 450, 7, 300)
	id := env.Create(t, "acme", "spring-renewals", "renewals", 200, time.Now().Add(time.Hour))
	require.Equal(t, []campaign.Verdict{campaign.PlanSlice, campaign.PlanSlice}, env.Plan(t, id, 2))
	for k := 1; k <= 3; k++ {
		_, err := db.Pool.Exec(ctx, `SELECT nudge_cancel('acme', $1)`, fmt.Sprintf("campaign:%d:%d", id, k))
		require.NoError(t, err)
	}

	srv, err := console.New(console.Config{Token: token}, console.Deps{DB: db.Pool,
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	require.NoError(t, err)
	web := httptest.NewServer(srv)
	t.Cleanup(web.Close)

	resp, err := http.Get(web.URL + "/campaigns/" + itoa(id))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "/login", resp.Request.URL.Path, "without the token, sent to sign in")
	req, _ := http.NewRequest(http.MethodPost, web.URL+"/campaigns/"+itoa(id), strings.NewReader("action=cancel"))
	req.SetBasicAuth("mallory", token)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "the campaign pages change nothing")

	bctx, do, rawText := newBrowser(t, ctx, exe)
	text := func(sel string) string { t.Helper(); return strings.TrimSpace(rawText(sel)) }
	do("sign in to the campaigns",
		chromedp.Navigate(web.URL+"/campaigns"),
		chromedp.WaitVisible(chromedp.ID("login")),
		chromedp.SendKeys(chromedp.ID("name"), "alice"),
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.ID("sign-in")),
		chromedp.WaitVisible(chromedp.ID("campaigns")))
	list := text("campaigns")
	require.Contains(t, list, "spring-renewals")
	require.Contains(t, list, "planning")
	require.Contains(t, list, "398")

	do("open its status",
		chromedp.Click(chromedp.CSS(`#campaigns a[href="/campaigns/`+itoa(id)+`"]`)),
		chromedp.WaitVisible(chromedp.ID("detail")))
	require.Equal(t, "planning", text("state"))
	require.Equal(t, "398", text("planned"))
	require.Equal(t, "2", text("bad"))
	require.Equal(t, "50", text("remaining"))
	require.Equal(t, "2 (slice size 200)", text("slices"))
	require.Equal(t, "0", text("late"))
	require.Equal(t, "400 of 450 audience rows read", text("progress-text"))
	value, err := chromedp.Run(bctx, chromedp.AttributeValue(chromedp.ID("progress"), "value"))
	require.NoError(t, err)
	require.Equal(t, "400", value.Value)
	// Its reminders by state: a row of states over a row of counts.
	cells := strings.Fields(text("deliveries"))
	require.Len(t, cells, 2*len(reminder.States))
	counts := map[string]string{}
	for i, st := range reminder.States {
		require.Equal(t, string(st), cells[i])
		counts[cells[i]] = cells[len(reminder.States)+i]
	}
	require.Equal(t, "395", counts["pending"])
	require.Equal(t, "3", counts["canceled"])
	require.Equal(t, "0", counts["delivered"])
	screenshot(t, bctx, "console-campaign.png")

	do("search its reminders",
		chromedp.Click(chromedp.ID("its-reminders")),
		chromedp.WaitVisible(chromedp.ID("results")))
	require.Contains(t, text("count"), "of 398 selected")
}
