package ops

// QuerySQL exposes a statement of queries.sql to the package's external tests.
var QuerySQL = query
