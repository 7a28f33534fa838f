package deploycheck

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nudgehq/nudge/deploy/deploytest"
)

func TestDockerfile(t *testing.T) {
	root := mustRoot(t)
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if mk == nil {
		t.Log("no Makefile: not comparing with `make build`")
	}
	deploytest.NoErrors(t, checkDockerfile(string(df), string(mk), root))
}

func TestDockerfileCheckerCatches(t *testing.T) {
	root := mustRoot(t)
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mk := "LDFLAGS := -X github.com/nudgehq/nudge/internal/config.Version=$(VERSION)\n\nbuild:\n\tCGO_ENABLED=0 go build -trimpath -ldflags \"$(LDFLAGS)\" -o bin/ ./cmd/...\n"
	for _, b := range []deploytest.Breakage{
		{Name: "root user", Old: "USER 65532:65532", New: "USER root", Want: `runs as "root"`},
		{Name: "not every binary", Old: "-o /out/ ./cmd/...", New: "-o /out/ ./cmd/dispatcher", Want: "want ./cmd/..."},
		{Name: "cgo", Old: "    CGO_ENABLED=0 go build -trimpath", New: "    go build -trimpath", Want: "must run with CGO_ENABLED=0"},
		{Name: "wrong version variable", Old: "internal/config.Version", New: "internal/config.Verzion", Want: "declares no variable Verzion"},
		{Name: "not distroless nonroot", Old: "static-debian12:nonroot", New: "static-debian12:latest", Want: "distroless :nonroot"},
		{Name: "binaries not installed", Old: "COPY --from=build /out/ /usr/local/bin/", New: "COPY --from=build /out/ /bin/", Want: "must COPY --from=build"},
	} {
		t.Run(b.Name, func(t *testing.T) {
			deploytest.WantError(t, checkDockerfile(b.Apply(t, "Dockerfile", string(df)), mk, root), b.Want)
		})
	}
	t.Run("differs from make build", func(t *testing.T) {
		deploytest.WantError(t, checkDockerfile(string(df), strings.Replace(mk, "./cmd/...", "./cmd/... ./tools/...", 1), root), "`make build` builds")
	})
}
