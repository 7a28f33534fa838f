// Package e2e holds the end-to-end tests: the dispatcher, workers and
// reconciler running together against the real PostgreSQL, RabbitMQ and
// Mailpit, with the fake SMS provider at the provider boundary, asserting what
// a user would observe: final states, the event trail, and what the sinks got.
package e2e
