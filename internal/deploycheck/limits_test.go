package deploycheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/webhook"
)

// Every rate-limits file shipped under deploy/ is one the workers accept at
// start: a broken one would keep every worker pod from starting.
func TestLimitsFilesParse(t *testing.T) {
	files := deployFiles(t, func(name string) bool { return name == "limits.json" })
	if len(files) < 2 {
		t.Fatalf("expected the base's and the example overlay's limits.json, found %v", files)
	}
	for _, f := range files {
		if _, err := ratelimit.Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// Every webhook targets file shipped under deploy/ is one the webhook worker
// accepts at start.
func TestWebhookTargetsFilesParse(t *testing.T) {
	files := deployFiles(t, func(name string) bool { return strings.HasPrefix(name, "targets.") && filepath.Ext(name) == ".json" })
	if len(files) < 3 {
		t.Fatalf("expected the base's, the example overlay's and compose's targets files, found %v", files)
	}
	for _, f := range files {
		if _, err := webhook.LoadTargets(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// deployFiles lists the files under deploy/ whose names match.
func deployFiles(t *testing.T, match func(name string) bool) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(filepath.Join(mustRoot(t), "deploy"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && match(d.Name()) {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
