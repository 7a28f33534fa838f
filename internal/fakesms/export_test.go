package fakesms

// ShortPathServed is the number of requests f served on its short path.
func ShortPathServed(f *FastServer) int64 { return f.short.Load() }
