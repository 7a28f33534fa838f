package manifest

import (
	"bytes"
	"fmt"
	"os"
)

// Document is one YAML document of a file, as written.
type Document struct {
	File  string // the name it was split under, for messages
	Index int    // 1-based, counting the documents of the file that have content
	Data  []byte // its lines, comments included, without the separator
}

func (d Document) String() string { return fmt.Sprintf("%s: document %d", d.File, d.Index) }

// Split splits a multi-document YAML stream at its separator lines ("---",
// optionally followed by a comment), as kubectl and kustomize do, and drops
// the documents that hold only comments and blank lines. Text after a
// separator other than a comment is an error: it would be a document's
// first line that a line-based reader silently loses.
func Split(name string, data []byte) ([]Document, error) {
	var out []Document
	var cur []byte
	flush := func() {
		if hasContent(cur) {
			out = append(out, Document{File: name, Index: len(out) + 1, Data: cur})
		}
		cur = nil
	}
	n := 0
	for line := range bytes.Lines(data) {
		n++
		if rest, ok := bytes.CutPrefix(line, []byte("---")); ok {
			if r := bytes.TrimSpace(rest); len(r) > 0 && r[0] != '#' {
				return out, fmt.Errorf("%s: line %d: %q: only a comment may follow a document separator", name, n, bytes.TrimSpace(line))
			}
			flush()
			continue
		}
		cur = append(cur, line...)
	}
	flush()
	return out, nil
}

// ReadFile reads a file and splits it, naming its documents after path.
func ReadFile(path string) ([]Document, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Split(path, data)
}

// hasContent reports whether a document has a line that is neither blank
// nor a comment.
func hasContent(doc []byte) bool {
	for line := range bytes.Lines(doc) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			return true
		}
	}
	return false
}
