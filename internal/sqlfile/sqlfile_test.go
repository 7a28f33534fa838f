package sqlfile

import (
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	t.Parallel()
	q := Parse("x.sql", `-- header comment
-- name: First
SELECT 1 -- trailing comments stay
  -- own-line comments go
FROM t;

-- name: Second
SELECT @now;
`)
	if got, want := q.Get("First"), "SELECT 1 -- trailing comments stay\nFROM t;"; got != want {
		t.Errorf("First = %q, want %q", got, want)
	}
	if got := q.Get("Second"); got != "SELECT @now;" {
		t.Errorf("Second = %q", got)
	}
	names := q.Names()
	slices.Sort(names)
	if !slices.Equal(names, []string{"First", "Second"}) {
		t.Errorf("Names = %v", names)
	}
	defer func() {
		if recover() == nil {
			t.Error("Get of a missing name must panic")
		}
	}()
	q.Get("Third")
}
