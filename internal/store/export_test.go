package store

// OutcomeArgs exposes RecordOutcomes' arguments to the tests that run an
// earlier version's statement with them (folded_test.go).
var OutcomeArgs = outcomeArgs
