package manifest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Tree is a kustomize tree laid out as deploy/k8s is: the base in base/,
// optional add-ons as kustomize Components in components/NAME/, and one
// directory per environment in overlays/NAME/.
type Tree string

// Base is the directory of the base.
func (t Tree) Base() string { return filepath.Join(string(t), "base") }

// Components lists the component directories, sorted; none is an error.
func (t Tree) Components() ([]string, error) { return t.subdirs("components") }

// Overlays lists the overlay directories, sorted; none is an error.
func (t Tree) Overlays() ([]string, error) { return t.subdirs("overlays") }

func (t Tree) subdirs(kind string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(string(t), kind))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(string(t), kind, e.Name()))
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("no %s under %s", kind, t)
	}
	return dirs, nil
}
