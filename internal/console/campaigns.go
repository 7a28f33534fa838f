package console

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nudgehq/nudge/internal/campaign"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// campaignsShown bounds the campaigns list: the newest ones first are what
// an operator looks for; --tenant narrows it.
const campaignsShown = 200

// campaignsData is the campaigns page: read-only, as `nudgectl campaign list`.
type campaignsData struct {
	Tenant    string
	Campaigns []campaign.Status
	// Lag is each campaign's checkpoint lag (since its last slice), by ID.
	Lag map[int64]time.Duration
	Max int
	Err string
}

func (s *Server) campaigns(w http.ResponseWriter, r *http.Request) {
	tenant := r.URL.Query().Get("tenant")
	d := campaignsData{Tenant: tenant, Max: campaignsShown, Lag: map[int64]time.Duration{}}
	if len(tenant) > 200 {
		s.fail(w, r, http.StatusBadRequest, errors.New("tenant: at most 200 characters"))
		return
	}
	cs, err := campaign.List(r.Context(), s.deps.DB, tenant, campaignsShown)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	now := s.deps.Now()
	for _, c := range cs {
		if c.LastCheckpoint != nil && (c.State == campaign.Planning || c.State == campaign.Paused) {
			d.Lag[c.ID] = now.Sub(*c.LastCheckpoint)
		}
	}
	d.Campaigns = cs
	s.render(w, r, http.StatusOK, "campaigns", "Campaigns", d)
}

// campaignData is one campaign's status page: `nudgectl campaign status`.
type campaignData struct {
	Report      campaign.Report
	Done, Total int64
	Known       bool
	Lag         time.Duration
	States      []reminder.State
	// SliceTime is the measured slice time ("" before any); RealID, the
	// real run a shadow run is compared with (0: none).
	SliceTime string
	RealID    int64
}

func (s *Server) campaign(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, fmt.Errorf("campaign ID %q: must be a number", r.PathValue("id")))
		return
	}
	rep, err := campaign.GetReport(r.Context(), s.deps.DB, id, s.deps.Now())
	if errors.Is(err, campaign.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, err)
		return
	}
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	d := campaignData{Report: rep, States: reminder.States}
	d.Done, d.Total, d.Known = rep.Progress()
	if rep.SliceMSMedian != nil && rep.SliceMSP95 != nil {
		d.SliceTime = fmt.Sprintf("median %.0f ms, p95 %.0f ms (%d slices measured)", *rep.SliceMSMedian, *rep.SliceMSP95,
			rep.SlicesMeasured)
	}
	if c := rep.Comparison; c != nil && c.RealID != nil {
		d.RealID = *c.RealID
	}
	if rep.CheckpointLagSeconds != nil {
		d.Lag = time.Duration(*rep.CheckpointLagSeconds * float64(time.Second))
	}
	s.render(w, r, http.StatusOK, "campaign", fmt.Sprintf("Campaign %d: %s", id, rep.Name), d)
}
