package tlstest

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/broker"
)

// amqps:// verifies the node against cacertfile=; another CA is refused.
func TestRabbitMQAMQPS(t *testing.T) {
	s := setup(t)
	s.rabbitmq(t)

	conn, err := broker.Dial(s.amqpURL(s.ca), "tlstest")
	require.NoError(t, err)
	require.NoError(t, conn.Close())

	_, err = broker.Dial(s.amqpURL(s.wrong), "tlstest")
	require.ErrorContains(t, err, "x509: certificate signed by unknown authority")
	requireNoSecrets(t, err.Error())
}

// A client certificate logs in with EXTERNAL as its common name; a
// certificate of an unknown user is refused.
func TestRabbitMQClientCertificate(t *testing.T) {
	s := setup(t)
	s.rabbitmq(t)
	external := func(cert, key string) string {
		return fmt.Sprintf("amqps://127.0.0.1:%d/?cacertfile=%s&certfile=%s&keyfile=%s&auth_mechanism=external",
			s.mq.Port, url.QueryEscape(s.ca.File), url.QueryEscape(cert), url.QueryEscape(key))
	}
	conn, err := broker.Dial(external(s.mqCert, s.mqKey), "tlstest-external")
	require.NoError(t, err)
	require.NoError(t, conn.Close())

	// The PostgreSQL client certificate names nudge_cert, no broker user.
	_, err = broker.Dial(external(s.clientCert, s.clientKey), "tlstest-external")
	require.Error(t, err)
}
