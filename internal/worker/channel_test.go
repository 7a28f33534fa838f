package worker

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/nudgehq/nudge/internal/message"
	"github.com/nudgehq/nudge/internal/ratelimit"
	"github.com/nudgehq/nudge/internal/store"
	"github.com/nudgehq/nudge/pkg/reminder"
)

// channelKeys is the keyring a worker of channel is given: its channel's
// keys derived from unitKeys, and nothing else.
func channelKeys(t *testing.T, channel reminder.Channel) *message.Keyring {
	t.Helper()
	root, err := message.ParseKeys(unitKeys)
	require.NoError(t, err)
	spec, err := root.ChannelSpec(string(channel))
	require.NoError(t, err)
	k, err := message.ParseKeys(spec)
	require.NoError(t, err)
	return k
}

// Issue 13, finding 3: whatever a compromised SMS worker signs cannot make
// the email worker act. Its only key is the SMS channel's, and a message
// that claims channel email must carry a MAC made with the email key.
func TestEmailWorkerRefusesEmailWorkSignedWithTheSMSKey(t *testing.T) {
	t.Parallel()
	smsKeys := channelKeys(t, reminder.SMS)
	_, _, err := smsKeys.Seal(message.Envelope{ReminderID: 1, Fence: 7, Channel: "email"})
	require.ErrorIs(t, err, message.ErrUnknownKey, "the SMS key seals email work")
	// So it signs the email body with the key it has, as an attacker would:
	// HMAC(sms key, kid 0 body) under the key id every keyring knows.
	env := message.Envelope{ReminderID: 1, Fence: 7, Channel: "email", FirstSeen: t0, Deadline: at(time.Hour)}
	forge := func(body []byte) amqp.Table {
		mac := hmac.New(sha256.New, message.ChannelKey([]byte(unitKeys[len("unit:"):]), "sms"))
		mac.Write([]byte("unit\x00"))
		mac.Write(body)
		return amqp.Table{message.HeaderKeyID: "unit", message.HeaderSignature: hex.EncodeToString(mac.Sum(nil))}
	}
	forgedBody, err := json.Marshal(env)
	require.NoError(t, err)
	forgedHeaders := forge(forgedBody)
	// The forger's MAC is the SMS key's: it verifies on a body that says sms.
	smsBody := []byte(strings.Replace(string(forgedBody), `"channel":"email"`, `"channel":"sms"`, 1))
	_, err = smsKeys.Open(smsBody, forge(smsBody))
	require.NoError(t, err, "the forgery is not made as the SMS key makes MACs")

	root, err := message.ParseKeys(unitKeys)
	require.NoError(t, err)
	for name, keys := range map[string]*message.Keyring{
		"holding the email key": channelKeys(t, reminder.Email),
		"holding the root keys": root, // during the rollout to channel keys
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupFakesFor(t, reminder.Email, keys)
			b.addRow(row(func(r *store.Delivery) { r.ID, r.Channel = 1, reminder.Email }))
			before := *b.store.rows[1]
			// Forged: the SMS worker's own MAC over an email body.
			forged := amqp.Delivery{Acknowledger: b.acks, DeliveryTag: 1, Body: forgedBody, Headers: forgedHeaders}
			// Genuine, for contrast: sealed by the dispatcher's root keys.
			body, headers, err := root.Seal(env)
			require.NoError(t, err)
			genuine := amqp.Delivery{Acknowledger: b.acks, DeliveryTag: 2, Body: body, Headers: amqp.Table(headers)}

			b.w.process(context.Background(), []amqp.Delivery{forged})
			require.Equal(t, map[uint64]string{1: "ack"}, b.acks.settled)
			require.Empty(t, b.sender.calls, "the forged email work was sent")
			require.Equal(t, before, *b.store.rows[1], "the forged message touched the row")
			require.Len(t, b.pub.sent, 1)
			require.Equal(t, topo.DeadExchange(), b.pub.sent[0].Exchange)
			require.Contains(t, b.pub.sent[0].Msg.Headers[message.HeaderReason], "unverifiable: message signature does not verify")

			b.w.process(context.Background(), []amqp.Delivery{genuine})
			require.Equal(t, []int64{1}, b.sender.calls, "the genuine message is sent")
		})
	}
}

// Issue 13, finding 3: a signed message of channel sms naming an email
// reminder, consumed by the SMS worker, sends nothing and leaves the row as
// it was; it is dead-lettered with its reason.
func TestSMSWorkerDoesNotActOnAnEmailReminder(t *testing.T) {
	t.Parallel()
	for _, limited := range []bool{false, true} { // one statement, or a read then a claim
		b := setupFakesFor(t, reminder.SMS, channelKeys(t, reminder.SMS))
		if limited {
			b.w.fleet = allowAll{}
		}
		b.addRow(row(func(r *store.Delivery) { r.ID, r.Channel, r.Recipient = 1, reminder.Email, "a@example.com" }))
		before := *b.store.rows[1]

		b.w.process(context.Background(), []amqp.Delivery{b.delivery(t, 1, 1)}) // channel sms, reminder 1
		require.Equal(t, map[uint64]string{1: "ack"}, b.acks.settled)
		require.Empty(t, b.sender.calls, "an email reminder was sent by SMS (rate limited: %v)", limited)
		require.Equal(t, before, *b.store.rows[1], "the row was touched")
		require.Len(t, b.pub.sent, 1)
		require.Equal(t, topo.DeadExchange(), b.pub.sent[0].Exchange)
		require.Equal(t, `reminder 1 is of channel "email", not sms`, b.pub.sent[0].Msg.Headers[message.HeaderReason])
	}
}

// allowAll is a fleet-wide limiter that grants every send.
type allowAll struct{}

func (allowAll) Reserve(context.Context, time.Time, ratelimit.Flow, int, int) (ratelimit.Grant, error) {
	return ratelimit.Grant{Unlimited: true}, nil
}

func TestWorkerNeedsAKeyForItsChannel(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Channel: reminder.Email}, Deps{Topology: topo, Keys: channelKeys(t, reminder.SMS)})
	require.ErrorContains(t, err, "holds no key for it")
}
