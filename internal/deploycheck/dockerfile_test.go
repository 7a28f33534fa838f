package deploycheck

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	requireNoErrors(t, checkDockerfile(string(df), string(mk), root))
}

func TestDockerfileCheckerCatches(t *testing.T) {
	root := mustRoot(t)
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	mk := "LDFLAGS := -X github.com/nudgehq/nudge/internal/config.Version=$(VERSION)\n\nbuild:\n\tCGO_ENABLED=0 go build -trimpath -ldflags \"$(LDFLAGS)\" -o bin/ ./cmd/...\n"
	for _, b := range []breakage{
		{name: "root user", old: "USER 65532:65532", new: "USER root", want: `runs as "root"`},
		{name: "not every binary", old: "-o /out/ ./cmd/...", new: "-o /out/ ./cmd/dispatcher", want: "want ./cmd/..."},
		{name: "cgo", old: "    CGO_ENABLED=0 go build -trimpath", new: "    go build -trimpath", want: "must run with CGO_ENABLED=0"},
		{name: "wrong version variable", old: "internal/config.Version", new: "internal/config.Verzion", want: "declares no variable Verzion"},
		{name: "not distroless nonroot", old: "static-debian12:nonroot", new: "static-debian12:latest", want: "distroless :nonroot"},
		{name: "binaries not installed", old: "COPY --from=build /out/ /usr/local/bin/", new: "COPY --from=build /out/ /bin/", want: "must COPY --from=build"},
	} {
		t.Run(b.name, func(t *testing.T) {
			if !strings.Contains(string(df), b.old) {
				t.Fatalf("Dockerfile no longer contains %q: update this case", b.old)
			}
			wantError(t, checkDockerfile(strings.Replace(string(df), b.old, b.new, 1), mk, root), b.want)
		})
	}
	t.Run("differs from make build", func(t *testing.T) {
		wantError(t, checkDockerfile(string(df), strings.Replace(mk, "./cmd/...", "./cmd/... ./tools/...", 1), root), "`make build` builds")
	})
}
