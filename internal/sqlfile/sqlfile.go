// Package sqlfile reads named statements out of a .sql file, so queries live
// in SQL files that editors and reviewers read as SQL (River keeps its own
// this way), grouped per table, while Go code names each one it runs.
//
// A statement starts at a line "-- name: Name" and runs to the next such
// line; other comment lines are dropped (pgx's named-argument rewriting is
// kept away from them).
//
// A package keeps one .sql file and names its statements with string
// literals (directly, or through a helper that passes its parameter on); a
// test here reads every such package and fails on a name the file does not
// have and on a statement nothing names, so a typo never reaches Get's panic.
package sqlfile

import (
	"bufio"
	"strings"
)

// Queries holds the named statements of one file.
type Queries struct {
	file   string
	byName map[string]string
}

// Parse reads src, the contents of file.
func Parse(file, src string) Queries {
	q := Queries{file: file, byName: map[string]string{}}
	var name string
	var b strings.Builder
	flush := func() {
		if name != "" {
			q.byName[name] = strings.TrimSpace(b.String())
		}
		b.Reset()
	}
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if n, ok := strings.CutPrefix(trimmed, "-- name:"); ok {
			flush()
			name = strings.TrimSpace(n)
			continue
		}
		if strings.HasPrefix(trimmed, "--") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	flush()
	return q
}

// Get returns the statement called name. A missing name is a programming
// error (the file and the code disagree; TestEveryQueryNameExistsAndIsUsed
// catches it) and panics.
func (q Queries) Get(name string) string {
	s, ok := q.byName[name]
	if !ok {
		panic("sqlfile: no query named " + name + " in " + q.file)
	}
	return s
}

// Names lists the statements, for the test that checks every one is used.
func (q Queries) Names() []string {
	out := make([]string, 0, len(q.byName))
	for n := range q.byName {
		out = append(out, n)
	}
	return out
}
