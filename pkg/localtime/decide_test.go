package localtime_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/localtime"
)

func TestDecide(t *testing.T) {
	t.Parallel()
	const noWindow, deadline = localtime.ReasonNoWindow, localtime.ReasonDeadline
	tests := []struct {
		name, zone, window, now, deadline string
		margin                            time.Duration
		verdict                           localtime.Verdict
		at, reason                        string
	}{
		{"open: send", "Europe/Stockholm", "08:00-21:00", "2027-03-27T12:00:00+01:00", "2027-03-28T12:00:00+02:00",
			0, localtime.Send, "", ""},
		{"any time: send", "Europe/Stockholm", "any", "2027-03-28T02:30:00+01:00", "2027-03-28T12:00:00+02:00",
			time.Minute, localtime.Send, "", ""},
		{"closed: defer across the gap to the next opening", "Europe/Stockholm", "08:00-21:00", "2027-03-27T22:00:00+01:00", "2027-03-28T12:00:00+02:00",
			0, localtime.Defer, "2027-03-28T08:00:00+02:00", ""},
		{"deadline inside the next opening", "Europe/Stockholm", "08:00-21:00", "2027-03-27T22:00:00+01:00", "2027-03-28T08:00:01+02:00",
			0, localtime.Defer, "2027-03-28T08:00:00+02:00", ""},
		{"deadline at the next opening: expire", "Europe/Stockholm", "08:00-21:00", "2027-03-27T22:00:00+01:00", "2027-03-28T08:00:00+02:00",
			0, localtime.Expire, "", noWindow},
		{"deadline before the next opening: expire", "Europe/Stockholm", "08:00-21:00", "2027-03-27T22:00:00+01:00", "2027-03-28T07:00:00+02:00",
			0, localtime.Expire, "", noWindow},
		{"the next opening leaves less than the margin before the deadline", "Europe/Stockholm", "08:00-21:00", "2027-03-27T22:00:00+01:00", "2027-03-28T08:00:30+02:00",
			time.Minute, localtime.Expire, "", noWindow},
		{"closing within the margin: defer to the next day", "Europe/Stockholm", "08:00-21:00", "2027-10-30T20:59:30+02:00", "2027-11-02T00:00:00+01:00",
			time.Minute, localtime.Defer, "2027-10-31T08:00:00+01:00", ""},
		{"closing just after the margin: send", "Europe/Stockholm", "08:00-21:00", "2027-10-30T20:59:00+02:00", "2027-11-02T00:00:00+01:00",
			time.Minute, localtime.Send, "", ""},
		{"now within the margin of the deadline", "Europe/Stockholm", "any", "2027-03-28T11:59:30+02:00", "2027-03-28T12:00:00+02:00",
			time.Minute, localtime.Expire, "", deadline},
		{"now at the deadline", "Europe/Stockholm", "any", "2027-03-28T12:00:00+02:00", "2027-03-28T12:00:00+02:00",
			0, localtime.Expire, "", deadline},
		{"weekdays: friday evening to monday, across the overlap", "America/New_York", "mon-fri 09:00-17:00", "2027-11-05T16:59:30-04:00", "2027-11-09T00:00:00-05:00",
			time.Minute, localtime.Defer, "2027-11-08T09:00:00-05:00", ""},
		{"weekdays: deadline on sunday", "America/New_York", "mon-fri 09:00-17:00", "2027-11-05T17:00:00-04:00", "2027-11-07T23:59:00-05:00",
			0, localtime.Expire, "", noWindow},
		{"overnight, open across the gap", "America/New_York", "21:00-08:00", "2027-03-14T02:00:00-05:00", "2027-03-14T12:00:00-04:00",
			0, localtime.Send, "", ""},
		{"the gap empties the only opening before the deadline", "Australia/Lord_Howe", "02:20-02:40", "2027-10-02T12:00:00+10:30", "2027-10-04T00:00:00+11:00",
			0, localtime.Expire, "", noWindow},
		{"the opening after the emptied one", "Australia/Lord_Howe", "02:20-02:40", "2027-10-02T12:00:00+10:30", "2027-10-05T00:00:00+11:00",
			0, localtime.Defer, "2027-10-04T02:20:00+11:00", ""},
		{"the overlap's second reading is outside the window", "Australia/Lord_Howe", "01:40-01:50", "2027-04-04T01:45:00+10:30", "2027-04-06T00:00:00+10:30",
			0, localtime.Defer, "2027-04-05T01:40:00+10:30", ""},
		{"openings too short for the margin", "Europe/Stockholm", "09:00-09:01", "2027-06-01T12:00:00+02:00", "2028-06-01T12:00:00+02:00",
			2 * time.Minute, localtime.Expire, "", noWindow},
	}
	for _, src := range zoneSources() {
		for _, tc := range tests {
			t.Run(src.name+" "+tc.name, func(t *testing.T) {
				t.Parallel()
				loc, w := src.load(t, tc.zone), window(t, tc.window)
				got := localtime.Decide(w, loc, inst(t, tc.now), inst(t, tc.deadline), tc.margin)
				require.Equal(t, tc.verdict, got.Verdict, "%+v", got)
				require.True(t, inst(t, tc.at).Equal(got.At), "At: got %s, want %s", got.At, tc.at)
				require.Equal(t, tc.reason, got.Reason)
			})
		}
	}
}

func TestVerdictString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "send defer expire Verdict(7)", localtime.Send.String()+" "+localtime.Defer.String()+" "+
		localtime.Expire.String()+" "+localtime.Verdict(7).String())
}
