package deploycheck

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

var loadBinaries = sync.OnceValues(func() (clis, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "deploycheck-bin-")
	if err != nil {
		return nil, err
	}
	// The binaries are only run with --help; the directory is small and
	// removed here once their help is read.
	defer os.RemoveAll(dir)
	build := exec.Command("go", "build", "-buildvcs=false", "-o", dir+string(filepath.Separator), "./cmd/...")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./cmd/...: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	cs := clis{}
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".exe")
		c, err := readCLI(filepath.Join(dir, e.Name()), []string{name})
		if err != nil {
			return nil, err
		}
		cs[name] = c
	}
	if len(cs) == 0 {
		return nil, errors.New("go build ./cmd/... built no binaries")
	}
	return cs, nil
})

// readCLI runs BIN [SUB...] --help and parses it, and its subcommands.
func readCLI(bin string, cmdPath []string) (*cli, error) {
	cmd := exec.Command(bin, append(slices.Clone(cmdPath[1:]), "--help")...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NUDGE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s --help: %v", strings.Join(cmdPath, " "), err)
	}
	c, subs := parseHelp(strings.Join(cmdPath, " "), string(out))
	if len(c.flags) == 0 {
		return nil, fmt.Errorf("%s --help: found no flags in:\n%s", c.path, out)
	}
	for _, s := range subs {
		sc, err := readCLI(bin, append(slices.Clone(cmdPath), s))
		if err != nil {
			return nil, err
		}
		c.subs[s] = sc
	}
	return c, nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
