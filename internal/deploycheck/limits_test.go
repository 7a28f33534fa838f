package deploycheck

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nudgehq/nudge/internal/ratelimit"
)

// Every rate-limits file shipped under deploy/ is one the workers accept at
// start: a broken one would keep every worker pod from starting.
func TestLimitsFilesParse(t *testing.T) {
	root := mustRoot(t)
	var files []string
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "limits.json" {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 2 {
		t.Fatalf("expected the base's and the example overlay's limits.json, found %v", files)
	}
	for _, f := range files {
		if _, err := ratelimit.Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}
