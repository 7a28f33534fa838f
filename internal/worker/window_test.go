package worker

import (
	"testing"
	"time"

	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// The send window decisions, before the claim and before the send, for an
// SMS window of 08:00-21:00 in Stockholm around its close and across both
// daylight-saving transitions of 2027.
func TestWindowDecisions(t *testing.T) {
	t.Parallel()
	sthlm, err := localtime.LoadZone("Europe/Stockholm")
	if err != nil {
		t.Fatal(err)
	}
	day, err := localtime.ParseWindow("08:00-21:00")
	if err != nil {
		t.Fatal(err)
	}
	local := func(s string) time.Time {
		x, err := localtime.ParseLocal(s, "Europe/Stockholm")
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	notSent := "not sent: the send window is closed"
	for _, tc := range []struct {
		name                       string
		w                          localtime.Window
		loc                        *time.Location
		now, deadline              time.Time
		beforeClaim, beforeTheSend verdict
	}{
		{"any time: always", localtime.AnyTime, sthlm, local("2027-03-27T03:00"), local("2027-03-27T04:00"),
			verdict{kind: kindClaim}, verdict{kind: kindSend}},
		{"open", day, sthlm, local("2027-03-27T20:59"), local("2027-03-28T23:00"),
			verdict{kind: kindClaim}, verdict{kind: kindSend}},
		{"just closed, opens again after spring forward (08:00 CEST is 06:00Z)", day, sthlm,
			local("2027-03-27T21:00"), local("2027-03-28T23:00"),
			verdict{kind: kindWaitWindow, at: local("2027-03-28T08:00"), code: "window_closed"},
			verdict{kind: kindRetry, at: local("2027-03-28T08:00"), code: "window_closed", transition: reminder.CodeWindowClosed,
				attempt: reminder.OutcomeNotSent, err: notSent, reason: "send window closed; retrying at its next opening 2027-03-28T06:00:00Z"}},
		{"closed after fall back (08:00 CET is 07:00Z)", day, sthlm, local("2027-10-31T02:30"), local("2027-10-31T23:00"),
			verdict{kind: kindWaitWindow, at: time.Date(2027, 10, 31, 7, 0, 0, 0, time.UTC), code: "window_closed"},
			verdict{kind: kindRetry, at: time.Date(2027, 10, 31, 7, 0, 0, 0, time.UTC), code: "window_closed",
				transition: reminder.CodeWindowClosed, attempt: reminder.OutcomeNotSent, err: notSent,
				reason: "send window closed; retrying at its next opening 2027-10-31T07:00:00Z"}},
		{"closed, and the deadline comes first", day, sthlm, local("2027-03-27T21:30"), local("2027-03-28T08:00"),
			verdict{kind: kindExpireNoWindow, reason: reasonNoWindow, code: "no_window_before_deadline"},
			verdict{kind: kindExpire, reason: reasonNoWindow, code: "no_window_before_deadline",
				transition: reminder.CodeNoWindowBeforeDeadline, attempt: reminder.OutcomeNotSent, err: notSent}},
		{"an unknown zone: quarantined before the claim, sent after it (SQL judged the claim)", day, nil,
			local("2027-03-27T12:00"), local("2027-03-28T12:00"),
			verdict{kind: kindQuarantine, code: codePoison, reason: "quarantined: the recipient's time zone is unknown to this worker's zone database"},
			verdict{kind: kindSend}},
	} {
		if got := windowBeforeClaim(tc.w, tc.loc, tc.now, tc.deadline); !equalVerdict(got, tc.beforeClaim) {
			t.Errorf("%s, before the claim:\n got  %v\n want %v", tc.name, got, tc.beforeClaim)
		}
		if got := onWindow(tc.w, tc.loc, tc.now, tc.deadline, 0); !equalVerdict(got, tc.beforeTheSend) {
			t.Errorf("%s, before the send:\n got  %v\n want %v", tc.name, got, tc.beforeTheSend)
		}
	}
}

// equalVerdict compares verdicts with instants compared as instants.
func equalVerdict(a, b verdict) bool {
	if !a.at.Equal(b.at) {
		return false
	}
	a.at, b.at = time.Time{}, time.Time{}
	return a == b
}

// Every window verdict that ends an attempt follows the transition table.
func TestWindowVerdictsFollowTheTransitionTable(t *testing.T) {
	t.Parallel()
	w, _ := localtime.ParseWindow("08:00-21:00")
	night := time.Date(2027, 3, 27, 23, 0, 0, 0, time.UTC)
	for _, v := range []verdict{
		onWindow(w, time.UTC, night, night.Add(24*time.Hour), 0),
		onWindow(w, time.UTC, night, night.Add(time.Hour), 0),
	} {
		want := map[kind]reminder.State{kindRetry: reminder.Retrying, kindExpire: reminder.Expired}[v.kind]
		got, err := reminder.Target(reminder.Worker, reminder.Code(v.transition), reminder.Sending)
		if err != nil || got != want {
			t.Errorf("%s: got %q (%v), want %q", v, got, err, want)
		}
	}
	for _, v := range []verdict{windowBeforeClaim(w, time.UTC, night, night.Add(time.Hour))} {
		if _, err := reminder.Target(reminder.Worker, reminder.CodeNoWindowBeforeDeadline,
			reminder.Leased, reminder.Enqueued, reminder.Retrying); err != nil || v.kind != kindExpireNoWindow {
			t.Errorf("%s: %v", v, err)
		}
	}
}
