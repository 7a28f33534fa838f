package deploytest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Breakage is one deliberate mistake in a copy of a real file: the first Old
// in File becomes New, and the check must then report an error that
// mentions Want.
type Breakage struct {
	Name     string
	File     string // slash-separated, inside the copied directory; "" when the copy is of a file
	Old, New string
	Want     string // a substring of one of the check's errors
}

// Copy copies src (a file, or a directory with everything below it) to a
// temporary directory, applies b to the copy, and returns the copy's path.
// It fails the test when the file no longer contains Old: the real file has
// changed and the case must follow it, or it would test nothing.
func (b Breakage) Copy(tb testing.TB, src string) string {
	tb.Helper()
	info, err := os.Stat(src)
	if err != nil {
		tb.Fatal(err)
	}
	dst := filepath.Join(tb.TempDir(), filepath.Base(src))
	target := dst
	if info.IsDir() {
		if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
			tb.Fatal(err)
		}
		target = filepath.Join(dst, filepath.FromSlash(b.File))
	} else if err := copyFile(src, dst); err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(target)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(target, []byte(b.Apply(tb, target, string(data))), 0o644); err != nil {
		tb.Fatal(err)
	}
	return dst
}

// Apply applies b to text, which name names in the failure it reports when
// text does not contain Old.
func (b Breakage) Apply(tb testing.TB, name, text string) string {
	tb.Helper()
	if !strings.Contains(text, b.Old) {
		tb.Fatalf("%s no longer contains %q: update the case %q", name, b.Old, b.Name)
	}
	return strings.Replace(text, b.Old, b.New, 1)
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, fs.FileMode(0o644))
}
