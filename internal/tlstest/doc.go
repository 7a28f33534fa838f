// Package tlstest proves, against servers it starts itself, that Nudge
// verifies TLS rather than assuming it: a PostgreSQL cluster that accepts
// only TLS (initdb on a spare port), a RabbitMQ node that listens only for
// AMQPS, and Mailpit with STARTTLS and implicit TLS, all with certificates
// from a CA the tests generate. Each is reached with verification (its CA
// accepted), shown to refuse another CA with a clear error, and PostgreSQL
// and RabbitMQ once with a client certificate. A full run of every binary
// over these connections is then searched for each password, token and key
// the test configured (with "/", "@", ":", "%", "?" and "#" in them): none
// may appear in logs, metrics or nudgectl's output.
//
// The tests need the PostgreSQL server binaries (/usr/lib/postgresql/*/bin)
// and RabbitMQ (/usr/lib/rabbitmq/bin); scripts/ensure-services.sh installs
// them. Under CI=true a missing one fails the tests.
package tlstest
