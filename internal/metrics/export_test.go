package metrics

// DBGaugesSQL is the DBGauges statement, for the scrape's benchmark (its
// buffers under EXPLAIN).
func DBGaugesSQL() string { return query("DBGauges") }
