package localtimetest_test

import (
	"testing"

	"github.com/nudgehq/nudge/pkg/localtime"
	"github.com/nudgehq/nudge/pkg/localtime/localtimetest"
)

// The cases' instants are what localtime.ParseLocal resolves.
func TestCasesResolveAsLocaltime(t *testing.T) {
	t.Parallel()
	for _, c := range localtimetest.DST {
		due, err := localtime.ParseLocal(c.DueLocal, c.Zone)
		if err != nil || !due.Equal(c.WantDue) {
			t.Errorf("%s due: got %s (%v), want %s", c.Name, due, err, c.WantDue)
		}
		dl, err := localtime.ParseLocal(c.DeadlineLocal, c.Zone)
		if err != nil || !dl.Equal(c.WantDeadline) {
			t.Errorf("%s deadline: got %s (%v), want %s", c.Name, dl, err, c.WantDeadline)
		}
	}
}
