package store

import (
	"context"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

var atName = regexp.MustCompile(`@([A-Za-z_][A-Za-z0-9_]*)`)

// argsFor gives every @name in sql a value of its own (a superset of the
// names pgx finds: some may sit in comments or literals).
func argsFor(sql string) map[string]any {
	m := map[string]any{}
	for i, g := range atName.FindAllStringSubmatch(sql, -1) {
		if _, ok := m[g[1]]; !ok {
			m[g[1]] = i + 1
		}
	}
	return m
}

// TestNamedRewritesAsPgx: for every statement of queries.sql, named sends
// the text and the arguments pgx.NamedArgs sends, on its first call (when it
// learns the rewrite), from its cache, and when a call leaves a name out
// (nil in its place, as pgx has it). It fails if the cached order of the
// arguments differs from pgx's.
func TestNamedRewritesAsPgx(t *testing.T) {
	ctx := context.Background()
	for _, name := range queries.Names() {
		sql := query(name)
		m := argsFor(sql)
		wantSQL, wantArgs, err := pgx.NamedArgs(m).RewriteQuery(ctx, nil, sql, nil)
		require.NoError(t, err)
		for round := range 2 { // learning, then cached
			gotSQL, gotArgs, err := named(m).RewriteQuery(ctx, nil, sql, nil)
			require.NoError(t, err)
			require.Equal(t, wantSQL, gotSQL, "%s, round %d", name, round)
			require.Equal(t, wantArgs, gotArgs, "%s, round %d", name, round)
		}
		for k := range m { // one name left out
			less := map[string]any{}
			for k2, v := range m {
				if k2 != k {
					less[k2] = v
				}
			}
			wantSQL, wantArgs, err := pgx.NamedArgs(less).RewriteQuery(ctx, nil, sql, nil)
			require.NoError(t, err)
			gotSQL, gotArgs, err := named(less).RewriteQuery(ctx, nil, sql, nil)
			require.NoError(t, err)
			require.Equal(t, wantSQL, gotSQL, "%s without %s", name, k)
			require.Equal(t, wantArgs, gotArgs, "%s without %s", name, k)
			break
		}
	}
}

// TestNamedLearnsOnlyFromACompleteCall: a first call that leaves a name out
// does not fix the order; the next, complete call still gets pgx's.
func TestNamedLearnsOnlyFromACompleteCall(t *testing.T) {
	ctx := context.Background()
	sql := `SELECT @b::int, @a::int, @b::int /* @c */, '@d'` // a text no other test uses
	_, got, err := named{"a": 1}.RewriteQuery(ctx, nil, sql, nil)
	require.NoError(t, err)
	require.Equal(t, []any{nil, 1}, got)
	newSQL, got, err := named{"a": 1, "b": 2}.RewriteQuery(ctx, nil, sql, nil)
	require.NoError(t, err)
	require.Equal(t, `SELECT $1::int, $2::int, $1::int /* @c */, '@d'`, newSQL)
	require.Equal(t, []any{2, 1}, got)
	_, got, err = named{"b": 3, "a": 4, "x": 5}.RewriteQuery(ctx, nil, sql, nil)
	require.NoError(t, err)
	require.Equal(t, []any{3, 4}, got)
}

// BenchmarkNamedRewrite: the rewrite of RecordOutcomes' statement per call,
// pgx.NamedArgs against named.
//
//	go test ./internal/store -run '^$' -bench NamedRewrite -benchmem
func BenchmarkNamedRewrite(b *testing.B) {
	ctx := context.Background()
	sql := query("RecordOutcomes")
	m := argsFor(sql)
	b.Run("pgx", func(b *testing.B) {
		for b.Loop() {
			_, _, _ = pgx.NamedArgs(m).RewriteQuery(ctx, nil, sql, nil)
		}
	})
	b.Run("named", func(b *testing.B) {
		for b.Loop() {
			_, _, _ = named(m).RewriteQuery(ctx, nil, sql, nil)
		}
	})
}
