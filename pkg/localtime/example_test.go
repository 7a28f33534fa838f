package localtime_test

import (
	"fmt"
	"time"

	"github.com/nudgehq/nudge/pkg/localtime"
)

// 02:30 does not exist on Stockholm's spring-forward day and exists twice on
// its fall-back day.
func ExampleParseLocal() {
	for _, wall := range []string{"2027-03-28T09:00", "2027-03-28T02:30", "2027-10-31T02:30"} {
		at, err := localtime.ParseLocal(wall, "Europe/Stockholm")
		if err != nil {
			panic(err)
		}
		fmt.Println(wall, "→", at.Format(time.RFC3339), "=", at.UTC().Format(time.RFC3339))
	}
	_, err := localtime.ParseLocal("2027-03-28T09:00", "Europe/Stokholm")
	fmt.Println(err)
	// Output:
	// 2027-03-28T09:00 → 2027-03-28T09:00:00+02:00 = 2027-03-28T07:00:00Z
	// 2027-03-28T02:30 → 2027-03-28T03:30:00+02:00 = 2027-03-28T01:30:00Z
	// 2027-10-31T02:30 → 2027-10-31T02:30:00+02:00 = 2027-10-31T00:30:00Z
	// invalid time zone: unknown zone "Europe/Stokholm" (want an IANA name such as "Europe/Stockholm" or "UTC")
}

// An SMS window, checked by a worker on a Friday night.
func ExampleDecide() {
	loc, _ := localtime.LoadZone("America/New_York")
	w, _ := localtime.ParseWindow("mon-fri 08:00-21:00")
	now := time.Date(2027, 11, 5, 21, 30, 0, 0, loc)
	for _, deadline := range []time.Time{now.Add(96 * time.Hour), now.Add(24 * time.Hour)} {
		d := localtime.Decide(w, loc, now, deadline, time.Minute)
		switch d.Verdict {
		case localtime.Defer:
			fmt.Println("defer until", d.At.Format(time.RFC3339))
		default:
			fmt.Println(d.Verdict, d.Reason)
		}
	}
	// Output:
	// defer until 2027-11-08T08:00:00-05:00
	// expire no_window_before_deadline
}
