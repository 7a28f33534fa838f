package deploycheck

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// The Dockerfile must build what `make build` builds and run it as the
// nonroot user; both are read here with small parsers of their own.

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
}

func parseDockerfile(src string) []instruction {
	var out []instruction
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
	}
	for _, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(t, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(t)
		flush()
	}
	flush()
	return out
}

// goBuild is what a `go build` command line builds.
type goBuild struct {
	packages []string
	cgoOff   bool
	versionX string // the -X target that sets the version, IMPORTPATH.NAME
	out      string
}

var reVersionX = regexp.MustCompile(`-X[= ]+([\w./-]+\.\w+)=`)

func parseGoBuild(line string) (goBuild, bool) {
	i := strings.Index(line, "go build")
	if i < 0 {
		return goBuild{}, false
	}
	b := goBuild{cgoOff: strings.Contains(line[:i], "CGO_ENABLED=0")}
	if m := reVersionX.FindStringSubmatch(line); m != nil {
		b.versionX = m[1]
	}
	f := strings.Fields(line[i:])
	for j, w := range f {
		if strings.HasPrefix(w, "./") {
			b.packages = append(b.packages, w)
		}
		if w == "-o" && j+1 < len(f) {
			b.out = f[j+1]
		}
	}
	return b, true
}

// checkDockerfile checks the Dockerfile builds what `make build` builds and
// runs it as the nonroot user. makefile may be "" when there is none.
func checkDockerfile(dockerfile, makefile, root string) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf("Dockerfile: "+format, a...)) }
	type stage struct {
		from, name string
		ins        []instruction
	}
	var stages []*stage
	for _, in := range parseDockerfile(dockerfile) {
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			s := &stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
		}
	}
	if len(stages) < 2 {
		fail("want a builder stage and a final stage, have %d stage(s)", len(stages))
		return errs
	}
	var build goBuild
	builder := ""
	for _, s := range stages[:len(stages)-1] {
		for _, in := range s.ins {
			if in.cmd == "RUN" {
				if b, ok := parseGoBuild(in.args); ok {
					build, builder = b, s.name
				}
			}
		}
	}
	if builder == "" {
		fail("no builder stage (FROM ... AS NAME) runs go build")
		return errs
	}
	if !slices.Equal(build.packages, []string{"./cmd/..."}) {
		fail("go build builds %v, want ./cmd/... (every binary)", build.packages)
	}
	if !build.cgoOff {
		fail("go build must run with CGO_ENABLED=0: the final image has no libc")
	}
	if err := checkVersionVar(build.versionX, root); err != nil {
		fail("%v", err)
	}
	if makefile != "" {
		mk, ok := makeBuild(makefile)
		switch {
		case !ok:
			fail("the Makefile's build target runs no go build")
		case !slices.Equal(mk.packages, build.packages):
			fail("builds %v but `make build` builds %v", build.packages, mk.packages)
		case mk.versionX != build.versionX:
			fail("sets the version with -X %s but `make build` with -X %s", build.versionX, mk.versionX)
		case mk.cgoOff != build.cgoOff:
			fail("CGO_ENABLED differs from `make build`")
		}
	}
	final := stages[len(stages)-1]
	if !strings.Contains(final.from, "distroless") || !strings.HasSuffix(final.from, ":nonroot") {
		fail("final stage FROM %s, want a distroless :nonroot image", final.from)
	}
	user, copied := "", false
	for _, in := range final.ins {
		switch in.cmd {
		case "USER":
			user = in.args
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && f[0] == "--from="+builder && strings.TrimSuffix(f[1], "/") == strings.TrimSuffix(build.out, "/") &&
				strings.TrimSuffix(f[2], "/") == "/usr/local/bin" {
				copied = true
			}
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u != "65532" && u != "nonroot" {
		fail("final stage runs as %q, want USER 65532 (nonroot)", user)
	}
	if !copied {
		fail("final stage must COPY --from=%s %s /usr/local/bin/", builder, build.out)
	}
	return errs
}

var reMakeVar = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\s*(?::=|\?=|=)\s*(.*)$`)

// makeBuild finds the go build line of the Makefile's build target, with
// the Makefile's simple variables expanded.
func makeBuild(makefile string) (goBuild, bool) {
	vars := map[string]string{}
	for _, line := range strings.Split(makefile, "\n") {
		if m := reMakeVar.FindStringSubmatch(strings.TrimPrefix(line, "export ")); m != nil {
			vars[m[1]] = m[2]
		}
	}
	expand := func(s string) string {
		for range 5 {
			for k, v := range vars {
				s = strings.ReplaceAll(s, "$("+k+")", v)
			}
		}
		return s
	}
	in := false
	for _, line := range strings.Split(makefile, "\n") {
		switch {
		case strings.HasPrefix(line, "build:"):
			in = true
		case in && strings.HasPrefix(line, "\t"):
			if b, ok := parseGoBuild(expand(line)); ok {
				return b, true
			}
		case in && strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "#"):
			in = false
		}
	}
	return goBuild{}, false
}

// checkVersionVar checks -X IMPORTPATH.Version names a string variable that exists.
func checkVersionVar(target, root string) error {
	if target == "" {
		return errors.New("go build does not set the version with -ldflags -X .../internal/config.Version=")
	}
	modData, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return err
	}
	mod := ""
	for _, line := range strings.Split(string(modData), "\n") {
		if m, ok := strings.CutPrefix(line, "module "); ok {
			mod = strings.TrimSpace(m)
		}
	}
	pkg, name := target[:strings.LastIndex(target, ".")], target[strings.LastIndex(target, ".")+1:]
	rel, ok := strings.CutPrefix(pkg, mod+"/")
	if !ok {
		return fmt.Errorf("-X %s is outside module %s", target, mod)
	}
	files, _ := filepath.Glob(filepath.Join(root, filepath.FromSlash(rel), "*.go"))
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("-X %s: %v", target, err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.VAR {
				continue
			}
			for _, s := range g.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					if n.Name == name {
						return nil
					}
				}
			}
		}
	}
	return fmt.Errorf("-X %s: package %s declares no variable %s", target, pkg, name)
}
