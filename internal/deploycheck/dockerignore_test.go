package deploycheck

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nudgehq/nudge/deploy/deploytest"
)

func TestDockerignore(t *testing.T) {
	root := mustRoot(t)
	ig, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	need, err := buildInputs(root)
	if err != nil {
		t.Fatal(err)
	}
	deploytest.NoErrors(t, checkDockerignore(string(ig), need))
}

func TestDockerignoreCheckerCatches(t *testing.T) {
	need := []string{"go.mod", "go.sum", "cmd/dispatcher", "schema", "schema/migrations/0001.sql"}
	deploytest.WantError(t, checkDockerignore("schema\n", need), `"schema" excludes schema`)
	deploytest.WantError(t, checkDockerignore("**/*.sql\n", need), `excludes schema/migrations/0001.sql`)
	deploytest.NoErrors(t, checkDockerignore("*.sql\n", need)) // only top-level .sql files, as in Docker
	deploytest.WantError(t, checkDockerignore("go.*\n", need), "excludes go.mod")
	deploytest.NoErrors(t, checkDockerignore("*\n!go.mod\n!go.sum\n!cmd\n!schema\n", need))
}

func TestGlobMatch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		glob, name string
		want       bool
	}{
		{"schema", "schema", true},
		{"schema", "schema/x.sql", false}, // checkDockerignore tries each parent itself
		{"*.sql", "x.sql", true},
		{"*.sql", "schema/x.sql", false},
		{"**/*.sql", "x.sql", true},
		{"**/*.sql", "schema/migrations/x.sql", true},
		{"**/*.sql", "schema/migrations/x.go", false},
		{"**", "anything/at/all", true},
		{"cmd/*", "cmd/dispatcher", true},
		{"cmd/*", "internal/dispatcher", false},
	} {
		if got := globMatch(c.glob, c.name); got != c.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", c.glob, c.name, got, c.want)
		}
	}
}
