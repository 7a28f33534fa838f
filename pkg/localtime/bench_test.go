package localtime_test

import (
	"testing"
	"time"

	"github.com/nudgehq/nudge/pkg/localtime"
)

func BenchmarkResolve(b *testing.B) {
	loc, _ := localtime.LoadZone("Europe/Stockholm")
	w := localtime.Wall{Year: 2027, Month: 3, Day: 28, Hour: 2, Minute: 30}
	for b.Loop() {
		localtime.Resolve(w, loc)
	}
}

func BenchmarkDecide(b *testing.B) {
	loc, _ := localtime.LoadZone("Europe/Stockholm")
	w, _ := localtime.ParseWindow("mon-fri 08:00-21:00")
	now := time.Date(2027, 3, 26, 22, 0, 0, 0, loc)
	for b.Loop() {
		localtime.Decide(w, loc, now, now.Add(72*time.Hour), time.Minute)
	}
}
