package store

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
)

// named is pgx.NamedArgs whose rewrite of a statement (@name to $n) is
// worked out once per statement text and kept: pgx.NamedArgs lexes the
// whole text on every call, about 1% of the worker's CPU in the Pipeline
// benchmark for the two statements of every batch (docs/benchmarks.md,
// "The Go share of CPU per delivered reminder"). The text sent and the
// arguments are pgx's own, in the same order: the rewrite is pgx's, run
// once with each name standing for itself.
type named pgx.NamedArgs

// rewritten is a statement's text after pgx's rewrite and the name of each
// of its $n, in order.
type rewritten struct {
	sql   string
	names []string
}

// rewrites holds a *rewritten for each statement text seen. Only
// queries.sql's statements (a fixed set) are passed as named, so it stays
// as small as that file; a statement built at run time must use
// pgx.NamedArgs instead, or this map would grow with every text.
var rewrites sync.Map

// argName stands for a named argument while pgx rewrites a statement.
type argName string

// RewriteQuery implements pgx.QueryRewriter.
func (na named) RewriteQuery(ctx context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, error) {
	if v, ok := rewrites.Load(sql); ok {
		rw := v.(*rewritten)
		out := make([]any, len(rw.names))
		for i, n := range rw.names {
			out[i] = na[n] // nil when absent, as pgx.NamedArgs has it
		}
		return rw.sql, out, nil
	}
	probe := make(pgx.NamedArgs, len(na))
	for k := range na {
		probe[k] = argName(k)
	}
	newSQL, order, err := probe.RewriteQuery(ctx, conn, sql, args)
	if err != nil {
		return "", nil, err
	}
	names := make([]string, len(order))
	for i, a := range order {
		n, ok := a.(argName)
		if !ok { // a name this call does not give: learn it from a call that does
			return pgx.NamedArgs(na).RewriteQuery(ctx, conn, sql, args)
		}
		names[i] = string(n)
	}
	rewrites.Store(sql, &rewritten{sql: newSQL, names: names})
	return pgx.NamedArgs(na).RewriteQuery(ctx, conn, sql, args)
}
