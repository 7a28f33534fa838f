package deploycheck

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDockerignore(t *testing.T) {
	root := mustRoot(t)
	ig, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	requireNoErrors(t, checkDockerignore(string(ig), buildInputs(t, root)))
}

func TestDockerignoreCheckerCatches(t *testing.T) {
	need := []string{"go.mod", "go.sum", "cmd/dispatcher", "schema", "schema/migrations/0001.sql"}
	wantError(t, checkDockerignore("schema\n", need), `"schema" excludes schema`)
	wantError(t, checkDockerignore("**/*.sql\n", need), `excludes schema/migrations/0001.sql`)
	requireNoErrors(t, checkDockerignore("*.sql\n", need)) // only top-level .sql files, as in Docker
	wantError(t, checkDockerignore("go.*\n", need), "excludes go.mod")
	requireNoErrors(t, checkDockerignore("*\n!go.mod\n!go.sum\n!cmd\n!schema\n", need))
}
