package manifest

import (
	"slices"
	"strings"
	"testing"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, in string
		want     []string // each document's data
		wantErr  string
	}{
		{name: "one document", in: "kind: A\n", want: []string{"kind: A\n"}},
		{name: "no final newline", in: "kind: A", want: []string{"kind: A"}},
		{name: "two documents", in: "kind: A\n---\nkind: B\n", want: []string{"kind: A\n", "kind: B\n"}},
		{name: "leading separator", in: "---\nkind: A\n", want: []string{"kind: A\n"}},
		{name: "trailing separator", in: "kind: A\n---\n", want: []string{"kind: A\n"}},
		{name: "separator with a comment", in: "kind: A\n--- # next\nkind: B\n", want: []string{"kind: A\n", "kind: B\n"}},
		{name: "comments kept with content", in: "# head\nkind: A # why\n", want: []string{"# head\nkind: A # why\n"}},
		{name: "comment-only documents dropped", in: "# licence\n\n---\nkind: A\n---\n  # nothing\n---\n", want: []string{"kind: A\n"}},
		{name: "indented dashes are content", in: "a: |\n  ---\n", want: []string{"a: |\n  ---\n"}},
		{name: "CRLF", in: "kind: A\r\n---\r\nkind: B\r\n", want: []string{"kind: A\r\n", "kind: B\r\n"}},
		{name: "empty", in: "", want: nil},
		{name: "content after separator", in: "kind: A\n--- kind: B\n", wantErr: `f.yaml: line 2: "--- kind: B": only a comment may follow`},
	} {
		t.Run(c.name, func(t *testing.T) {
			docs, err := Split("f.yaml", []byte(c.in))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for i, d := range docs {
				got = append(got, string(d.Data))
				if d.File != "f.yaml" || d.Index != i+1 {
					t.Errorf("document %d is %s", i+1, d)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}
