package localtime_test

import (
	"archive/zip"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/pkg/localtime"
)

// A zone database the tests resolve against. The binaries embed time/tzdata
// and use it only when the machine has no zone files of its own, so both
// matter: "system" is what time.LoadLocation finds here, "tzdata" is Go's
// embedded copy (read from $GOROOT/lib/time/zoneinfo.zip, which time/tzdata
// is generated from). The embedded files are "slim": beyond their last
// listed transition they describe the zone by a rule, which exercises other
// code in package time than the system's "fat" files do.
type zoneSource struct {
	name string
	load func(t *testing.T, zone string) *time.Location
}

var (
	tzdataOnce sync.Once
	tzdataZip  map[string][]byte
	tzdataErr  error
)

// goTZData reads Go's zone database from GOROOT, once.
func goTZData(t *testing.T) map[string][]byte {
	t.Helper()
	tzdataOnce.Do(func() {
		var out []byte
		if out, tzdataErr = exec.Command("go", "env", "GOROOT").Output(); tzdataErr != nil {
			return
		}
		var r *zip.ReadCloser
		r, tzdataErr = zip.OpenReader(filepath.Join(strings.TrimSpace(string(out)), "lib", "time", "zoneinfo.zip"))
		if tzdataErr != nil {
			return
		}
		defer r.Close()
		tzdataZip = map[string][]byte{}
		for _, f := range r.File {
			var rc io.ReadCloser
			if rc, tzdataErr = f.Open(); tzdataErr != nil {
				return
			}
			tzdataZip[f.Name], tzdataErr = io.ReadAll(rc)
			rc.Close()
			if tzdataErr != nil {
				return
			}
		}
	})
	require.NoError(t, tzdataErr, "reading Go's zone database from GOROOT")
	return tzdataZip
}

func zoneSources() []zoneSource {
	return []zoneSource{
		{"system", zone},
		{"tzdata", func(t *testing.T, name string) *time.Location {
			t.Helper()
			_, err := localtime.LoadZone(name) // the same name checks
			require.NoError(t, err)
			data, ok := goTZData(t)[name]
			require.True(t, ok, "Go's zone database has no %s", name)
			loc, err := time.LoadLocationFromTZData(name, data)
			require.NoError(t, err)
			return loc
		}},
	}
}
