package deploycheck

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
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

func TestParseDockerfile(t *testing.T) {
	t.Parallel()
	got := parseDockerfile(`# syntax=docker/dockerfile:1
FROM golang:1.26 AS build
RUN --mount=type=cache,target=/go/pkg/mod \
    # a comment inside a continuation
    CGO_ENABLED=0 go build \
      -o /out/ ./cmd/...

from scratch
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532`)
	want := []instruction{
		{"FROM", "golang:1.26 AS build"},
		{"RUN", "--mount=type=cache,target=/go/pkg/mod CGO_ENABLED=0 go build -o /out/ ./cmd/..."},
		{"FROM", "scratch"},
		{"COPY", "--from=build /out/ /usr/local/bin/"},
		{"USER", "65532:65532"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d instructions %q, want %d", len(got), got, len(want))
	}
	for i := range want {
		// Continuation lines are joined with white space; only the words count.
		if got[i].cmd != want[i].cmd || strings.Join(strings.Fields(got[i].args), " ") != want[i].args {
			t.Errorf("instruction %d: got %q, want %q", i+1, got[i], want[i])
		}
	}
}

func TestParseGoBuild(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		line string
		ok   bool
		want goBuild
	}{
		{line: `CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/x/m/internal/config.Version=${VERSION}" -o /out/ ./cmd/...`,
			ok: true, want: goBuild{packages: []string{"./cmd/..."}, cgoOff: true, versionX: "github.com/x/m/internal/config.Version", out: "/out/"}},
		{line: `go build -ldflags "-X=github.com/x/m/v.Version=1" -o bin/ ./cmd/a ./cmd/b`,
			ok: true, want: goBuild{packages: []string{"./cmd/a", "./cmd/b"}, versionX: "github.com/x/m/v.Version", out: "bin/"}},
		{line: `go build ./cmd/... && CGO_ENABLED=0 true`, ok: true, want: goBuild{packages: []string{"./cmd/..."}}},
		{line: `go test ./...`},
	} {
		got, ok := parseGoBuild(c.line)
		if ok != c.ok || !slices.Equal(got.packages, c.want.packages) || got.cgoOff != c.want.cgoOff || got.versionX != c.want.versionX || got.out != c.want.out {
			t.Errorf("parseGoBuild(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func TestMakeBuild(t *testing.T) {
	t.Parallel()
	mk := `VERSION ?= dev
LDFLAGS := -X github.com/x/m/internal/config.Version=$(VERSION)
export GOFLAGS := -buildvcs=false
PKGS = ./cmd/...

## build: the binaries
build:
	# build them
	CGO_ENABLED=0 go build -ldflags "$(LDFLAGS)" -o bin/ $(PKGS)

test:
	go build -o /dev/null ./tools/...
`
	b, ok := makeBuild(mk)
	if !ok || !slices.Equal(b.packages, []string{"./cmd/..."}) || !b.cgoOff || b.versionX != "github.com/x/m/internal/config.Version" || b.out != "bin/" {
		t.Errorf("makeBuild = %+v, %v", b, ok)
	}
	if b, ok := makeBuild(strings.Replace(mk, "\tCGO_ENABLED=0 go build", "\techo", 1)); ok {
		t.Errorf("a build target without go build: got %+v from another target", b)
	}
}
