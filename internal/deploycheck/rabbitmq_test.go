package deploycheck

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/deploy/deploytest"
	"github.com/nudgehq/nudge/internal/broker"
	"github.com/nudgehq/nudge/internal/testenv"
)

func definitionsFile(t *testing.T) string {
	return filepath.Join(mustRoot(t), "deploy", "rabbitmq", "definitions.json")
}

func TestRabbitMQDefinitions(t *testing.T) {
	t.Parallel()
	d, err := readDefinitions(definitionsFile(t))
	if err != nil {
		t.Fatal(err)
	}
	topo := broker.Topology{}.WithDefaults()
	if topo.Prefix != "nudge" {
		t.Fatalf("the default prefix is %q; definitions.json is written for nudge", topo.Prefix)
	}
	deploytest.NoErrors(t, checkDefinitions(d, topo))
}

func TestRabbitMQDefinitionsCheckerCatches(t *testing.T) {
	t.Parallel()
	topo := broker.Topology{}.WithDefaults()
	for _, b := range []deploytest.Breakage{
		{Name: "dispatcher consumes work", Old: `"configure": "^$", "write": "^nudge\\.work$", "read": "^$"}`,
			New:  `"configure": "^$", "write": "^nudge\\.work$", "read": "^nudge\\.(email|sms)$"}`,
			Want: "user nudge-dispatcher must not have read on nudge.email (publishes, never consumes)"},
		{Name: "dispatcher writes the default exchange", Old: `"configure": "^$", "write": "^nudge\\.work$"`,
			New: `"configure": "^$", "write": "^(amq\\.default|nudge\\.work)$"`, Want: "user nudge-dispatcher must not have write on amq.default"},
		{Name: "planner consumes a channel's work", Old: `"read": "^nudge\\.plan$"}`, New: `"read": "^nudge\\.(plan|email)$"}`,
			Want: "user nudge-planner must not have read on nudge.email (consumes only nudge.plan)"},
		{Name: "planner cannot consume", Old: `"read": "^nudge\\.plan$"}`, New: `"read": "^$"}`,
			Want: "user nudge-planner needs read on nudge.plan (consumes planning commands)"},
		{Name: "email worker consumes planning commands", Old: `"read": "^nudge\\.email$"}`, New: `"read": "^nudge\\.(email|plan)$"}`,
			Want: "user nudge-email-worker must not have read on nudge.plan (only planners consume planning commands)"},
		{Name: "worker reads dead letters", Old: `"read": "^nudge\\.email$"}`, New: `"read": "^nudge\\.email(\\.dead)?$"}`,
			Want: "user nudge-email-worker must not have read on nudge.email.dead"},
		{Name: "worker reads the other channel", Old: `"read": "^nudge\\.email$"}`, New: `"read": "^nudge\\.(email|sms)$"}`,
			Want: "user nudge-email-worker must not have read on nudge.sms (consumes only nudge.email)"},
		{Name: "worker declares as it used to", Old: `"configure": "^$", "write": "^nudge\\.(email\\.retry|dead)$"`,
			New:  `"configure": "^nudge\\.(work|dead|(email|sms)(\\.dead|\\.retry\\.[0-9hms]+)?)$", "write": "^nudge\\.(email\\.retry|dead)$"`,
			Want: "user nudge-email-worker must not have configure on nudge.email (only the migration step declares (or deletes) the topology)"},
		{Name: "worker cannot publish retries", Old: `"write": "^nudge\\.(email\\.retry|dead)$"`, New: `"write": "^nudge\\.dead$"`,
			Want: "user nudge-email-worker needs write on nudge.email.retry"},
		{Name: "worker retries through the default exchange", Old: `"write": "^nudge\\.(email\\.retry|dead)$"`,
			New:  `"write": "^(amq\\.default|nudge\\.(email\\.retry|dead))$"`,
			Want: "user nudge-email-worker must not have write on amq.default (reaches every queue by name, other channels' included"},
		{Name: "sms worker writes the email retry exchange", Old: `"write": "^nudge\\.(sms\\.retry|dead)$"`,
			New:  `"write": "^nudge\\.((email|sms)\\.retry|dead)$"`,
			Want: "user nudge-sms-worker must not have write on nudge.email.retry (must not act on another channel's work)"},
		{Name: "worker publishes new work", Old: `"write": "^nudge\\.(email\\.retry|dead)$"`, New: `"write": "^nudge\\.(email\\.retry|work|dead)$"`,
			Want: "user nudge-email-worker must not have write on nudge.work"},
		{Name: "worker binds its queue", Old: `"write": "^nudge\\.(email\\.retry|dead)$"`, New: `"write": "^nudge\\.(email\\.retry|dead|email)$"`,
			Want: "user nudge-email-worker must not have write on nudge.email (could bind the queue)"},
		{Name: "retry exchange not declarable", Old: `"configure": "^nudge\\.(work|dead|(email|sms|webhook|plan)(\\.dead|\\.retry(\\.[0-9hms]+)?)?)$"`,
			New: `"configure": "^nudge\\.(work|dead|(email|sms|webhook|plan)(\\.dead|\\.retry\\.[0-9hms]+)?)$"`, Want: "user nudge-migrate needs configure on nudge.email.retry (declares the exchange)"},
		{Name: "retry tiers not bindable", Old: `"write": "^nudge\\.(work|dead|(email|sms|webhook|plan)(\\.dead|\\.retry\\.[0-9hms]+)?)$"`,
			New: `"write": "^nudge\\.(work|dead|(email|sms|webhook|plan)(\\.dead)?)$"`, Want: "user nudge-migrate needs write on nudge.email.retry.1s (binds the retry tier)"},
		{Name: "retry tier not declarable", Old: `"configure": "^nudge\\.(work|dead|(email|sms|webhook|plan)(\\.dead|\\.retry(\\.[0-9hms]+)?)?)$"`,
			New: `"configure": "^nudge\\.(work|dead|(email|sms|webhook|plan)(\\.dead|\\.retry)?)$"`, Want: "user nudge-migrate needs configure on nudge.email.retry.1s"},
		{Name: "dead-letter check forgotten", Old: `"read": "^nudge\\.(work|dead|(email|sms|webhook|plan)(\\.retry(\\.[0-9hms]+)?)?)$"}`,
			New: `"read": "^nudge\\.(work|dead|(email|sms|webhook|plan)(\\.retry)?)$"}`, Want: "needs read on nudge.email.retry.1s (declares the retry tier with a dead-letter exchange)"},
		{Name: "declarer reads dead letters", Old: `"read": "^nudge\\.(work|dead|(email|sms|webhook|plan)(\\.retry(\\.[0-9hms]+)?)?)$"}`,
			New:  `"read": "^nudge\\.(work|dead|(email|sms|webhook|plan)(\\.dead|\\.retry(\\.[0-9hms]+)?)?)$"}`,
			Want: "user nudge-migrate must not have read on nudge.email.dead"},
		{Name: "no declarer", Old: `{"user": "nudge-migrate", "vhost": "nudge",`, New: `{"user": "nudge-migrate", "vhost": "other",`,
			Want: "user nudge-migrate has no permissions in vhost nudge"},
		{Name: "unanchored", Old: `"write": "^nudge\\.work$"`, New: `"write": "nudge\\.work"`, Want: "must be anchored"},
		{Name: "prefix match", Old: `"write": "^nudge\\.work$"`, New: `"write": "^nudge\\.work"`, Want: "must not have write on nudge.workx"},
		{Name: "administrator", Old: `"tags": ["management"]`, New: `"tags": ["administrator"]`, Want: "tag administrator"},
		{Name: "a password in the repository", Old: `{"name": "nudge-keda", "password_hash": ""`, New: `{"name": "nudge-keda", "password_hash": "c2VjcmV0"`, Want: "password_hash must stay empty"},
		{Name: "unknown field", Old: `"rabbit_version"`, New: `"rabbit_versoin"`, Want: `unknown field "rabbit_versoin"`},
	} {
		t.Run(b.Name, func(t *testing.T) {
			d, err := readDefinitions(b.Copy(t, definitionsFile(t)))
			if err != nil {
				deploytest.WantError(t, []error{err}, b.Want)
				return
			}
			deploytest.WantError(t, checkDefinitions(d, topo), b.Want)
		})
	}
}

func TestRabbitMQDefinitionsLive(t *testing.T) {
	t.Parallel()
	amqpURL := os.Getenv("NUDGE_TEST_AMQP_URL")
	if amqpURL == "" {
		amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	base, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(base.Hostname()); base.Hostname() != "localhost" && (ip == nil || !ip.IsLoopback()) {
		testenv.Unavailable(t, "a local RabbitMQ node", "rabbitmqctl manages the local node, but NUDGE_TEST_AMQP_URL is "+base.Redacted()+", which is not loopback", nil)
	}
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		testenv.Unavailable(t, "rabbitmqctl", "install rabbitmq-server, or run `make services`", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mqConfig := amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)}
	if conn, err := amqp.DialConfig(amqpURL, mqConfig); err != nil {
		testenv.Unavailable(t, "RabbitMQ at "+base.Redacted(), "run `make services`", err)
	} else {
		conn.Close()
	}

	d, err := readDefinitions(definitionsFile(t))
	if err != nil {
		t.Fatal(err)
	}
	// The file as shipped, in a vhost and under user names of this test's,
	// with passwords set the way docs/deploy.md says to.
	suffix := randomHex(4)
	vhost := "nudge-deploycheck-" + suffix
	password := map[string]string{}
	user := func(name string) string { return name + "-" + suffix }
	for i, u := range d.Users {
		password[u.Name] = randomHex(12)
		d.Users[i].PasswordHash = passwordHash(password[u.Name])
		d.Users[i].Name = user(u.Name)
	}
	for i := range d.Permissions {
		d.Permissions[i].User = user(d.Permissions[i].User)
		d.Permissions[i].Vhost = vhost
	}
	d.Vhosts = []defVhost{{Name: vhost}}
	data, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := rabbitmqctl(ctx, data, "import_definitions", "--format", "json"); err != nil { // no path: stdin
		testenv.Unavailable(t, "importing definitions with rabbitmqctl", "needs root or the broker's Erlang cookie", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, args := range append([][]string{{"delete_vhost", vhost}}, func() (out [][]string) {
			for _, u := range d.Users {
				out = append(out, []string{"delete_user", u.Name})
			}
			return out
		}()...) {
			wg.Go(func() {
				if err := rabbitmqctl(ctx, nil, args...); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			})
		}
		wg.Wait()
	})
	t.Logf("imported %d users into vhost %s in %s", len(d.Users), vhost, time.Since(start).Round(time.Millisecond))

	dial := func(t *testing.T, name string) *amqp.Connection {
		t.Helper()
		u := *base
		u.User = url.UserPassword(user(name), password[name])
		u.Path, u.RawPath = "/"+vhost, "/"+url.PathEscape(vhost)
		conn, err := amqp.DialConfig(u.String(), mqConfig)
		if err != nil {
			t.Fatalf("%s cannot connect to vhost %s: %v", name, vhost, err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}

	topo := broker.Topology{}.WithDefaults()
	msg := amqp.Publishing{Body: []byte("deploycheck"), DeliveryMode: amqp.Persistent}
	// Each step runs on a connection of its own: a refusal closes the step's
	// channel, and a channel opened on the same connection right after it
	// can race the close (the broker answers 504 "expected channel.open" and
	// closes the whole connection).
	type step struct {
		what   string
		action func(*amqp.Connection) error
		ok     bool
	}
	onChannel := func(f func(*amqp.Channel) error) func(*amqp.Connection) error {
		return func(conn *amqp.Connection) error { return mqResult(conn, f) }
	}
	publish := func(exchange, key string) func(*amqp.Connection) error {
		return onChannel(func(ch *amqp.Channel) error {
			return ch.PublishWithContext(ctx, exchange, key, false, false, msg)
		})
	}
	consume := func(queue string) func(*amqp.Connection) error {
		return onChannel(func(ch *amqp.Channel) error {
			_, err := ch.Consume(queue, "", false, false, false, false, nil)
			return err
		})
	}
	declare := onChannel(topo.Declare)
	declareQueue := func(queue string) func(*amqp.Connection) error {
		return onChannel(func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
			return err
		})
	}
	deleteQueue := func(queue string) func(*amqp.Connection) error {
		return onChannel(func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(queue, false, false, false)
			return err
		})
	}
	bind := func(queue, exchange, key string) func(*amqp.Connection) error {
		return onChannel(func(ch *amqp.Channel) error { return ch.QueueBind(queue, key, exchange, false, nil) })
	}
	// check is the binaries' own start-up check (passive declares).
	check := func(u broker.Uses) func(*amqp.Connection) error {
		return func(conn *amqp.Connection) error { return broker.Check(conn, u) }
	}
	inspect := func(queue string) func(*amqp.Connection) error {
		return check(broker.Uses{Queues: []string{queue}})
	}
	plan := topo.Planning()
	retry := topo.RetryQueue("email", topo.RetryTiers[0])
	smsRetry := topo.RetryQueue("sms", topo.RetryTiers[0])
	steps := map[string][]step{
		mqMigrate: {
			{"declare the topology", declare, true},
			{"declare the topology again (idempotent)", declare, true},
			{"declare the planning queue", onChannel(plan.Declare), true},
			{"consume nudge.email.dead", consume(topo.DeadQueue("email")), false},
			{"declare a queue outside the topology", declareQueue("nudge.other"), false},
		},
		mqDispatcher: {
			{"check what it uses at start", check(topo.PublisherUses()), true},
			{"publish to nudge.work", publish(topo.WorkExchange(), "email"), true},
			{"consume nudge.email", consume(topo.Queue("email")), false},
			{"consume nudge.sms", consume(topo.Queue("sms")), false},
			{"consume a retry tier", consume(retry), false},
			{"consume nudge.email.dead", consume(topo.DeadQueue("email")), false},
			{"publish to a retry tier", publish("", retry), false},
			{"publish to a retry exchange", publish(topo.RetryExchange("email"), retry), false},
			{"publish to nudge.dead", publish(topo.DeadExchange(), "email"), false},
			{"declare the topology", declare, false},
			{"re-declare nudge.email", declareQueue(topo.Queue("email")), false},
			{"delete nudge.email", deleteQueue(topo.Queue("email")), false},
			{"declare a queue of its own", declareQueue("nudge.other"), false},
		},
		mqReconciler: {
			{"check what it uses at start", check(topo.PublisherUses()), true},
			{"read the depth of the dead-letter queues", check(broker.Uses{Queues: []string{topo.DeadQueue("email"), topo.DeadQueue("sms")}}), true},
			{"publish to nudge.work", publish(topo.WorkExchange(), "sms"), true},
			{"consume nudge.sms", consume(topo.Queue("sms")), false},
			{"consume nudge.sms.dead", consume(topo.DeadQueue("sms")), false},
			{"publish to a retry tier", publish("", retry), false},
			{"declare the topology", declare, false},
		},
		mqEmail: {
			{"check what it uses at start", check(topo.WorkerUses("email")), true},
			{"consume nudge.email", consume(topo.Queue("email")), true},
			{"publish to a retry tier through its retry exchange", publish(topo.RetryExchange("email"), retry), true},
			{"publish to nudge.dead", publish(topo.DeadExchange(), "email"), true},
			{"publish to a retry tier through the default exchange", publish("", retry), false},
			{"publish to the sms retry tiers", publish(topo.RetryExchange("sms"), smsRetry), false},
			{"consume nudge.sms", consume(topo.Queue("sms")), false},
			{"consume its own retry tier", consume(retry), false},
			{"consume nudge.email.dead", consume(topo.DeadQueue("email")), false},
			{"publish to nudge.work", publish(topo.WorkExchange(), "email"), false},
			{"publish to amq.topic", publish("amq.topic", "x"), false},
			{"declare the topology", declare, false},
			{"re-declare its own queue", declareQueue(topo.Queue("email")), false},
			{"delete its own queue", deleteQueue(topo.Queue("email")), false},
			{"delete a retry tier", deleteQueue(retry), false},
			{"bind its queue to nudge.dead", bind(topo.Queue("email"), topo.DeadExchange(), "sms"), false},
		},
		mqSMS: {
			{"check what it uses at start", check(topo.WorkerUses("sms")), true},
			{"consume nudge.sms", consume(topo.Queue("sms")), true},
			{"publish to a retry tier through its retry exchange", publish(topo.RetryExchange("sms"), smsRetry), true},
			{"publish to nudge.dead", publish(topo.DeadExchange(), "sms"), true},
			// Issue 13, finding 3: the SMS worker's user put work in the
			// email queue and its retry tiers through the default exchange.
			{"publish to nudge.email (through the default exchange)", publish("", topo.Queue("email")), false},
			{"publish to an email retry tier (through the default exchange)", publish("", retry), false},
			{"publish to an email retry tier (through the email retry exchange)", publish(topo.RetryExchange("email"), retry), false},
			{"publish to nudge.email (through nudge.work)", publish(topo.WorkExchange(), "email"), false},
			{"publish to its own retry tier through the default exchange", publish("", smsRetry), false},
			{"consume nudge.email", consume(topo.Queue("email")), false},
			{"consume nudge.sms.dead", consume(topo.DeadQueue("sms")), false},
			{"re-declare its own queue", declareQueue(topo.Queue("sms")), false},
			{"delete its own queue", deleteQueue(topo.Queue("sms")), false},
		},
		mqPlanner: {
			{"check what it uses at start", check(broker.Uses{Exchanges: []string{plan.WorkExchange()}, Queues: []string{plan.Queue(broker.PlanChannel)}}), true},
			{"consume nudge.plan", consume(plan.Queue(broker.PlanChannel)), true},
			{"publish a continuation to nudge.work", publish(plan.WorkExchange(), broker.PlanChannel), true},
			{"consume nudge.email", consume(topo.Queue("email")), false},
			{"consume nudge.plan.dead", consume(plan.DeadQueue(broker.PlanChannel)), false},
			{"publish to nudge.plan (through the default exchange)", publish("", plan.Queue(broker.PlanChannel)), false},
			{"publish to nudge.dead", publish(topo.DeadExchange(), broker.PlanChannel), false},
			{"re-declare nudge.plan", declareQueue(plan.Queue(broker.PlanChannel)), false},
			{"delete nudge.plan", deleteQueue(plan.Queue(broker.PlanChannel)), false},
		},
		mqOperator: {
			{"check the whole topology (nudgectl broker check)", check(topo.AllUses()), true},
			{"consume nudge.email.dead", consume(topo.DeadQueue("email")), true},
			{"publish to nudge.work", publish(topo.WorkExchange(), "email"), true},
			{"consume nudge.email", consume(topo.Queue("email")), false},
			{"consume a retry tier", consume(retry), false},
			{"publish to a retry tier", publish("", retry), false},
			{"publish to a retry exchange", publish(topo.RetryExchange("email"), retry), false},
			{"declare the topology", declare, false},
			{"delete nudge.email.dead", deleteQueue(topo.DeadQueue("email")), false},
		},
		mqKEDA: {
			{"read the depth of nudge.email", inspect(topo.Queue("email")), true},
			{"read the depth of nudge.sms", inspect(topo.Queue("sms")), true},
			{"consume nudge.email", consume(topo.Queue("email")), false},
			{"publish to nudge.work", publish(topo.WorkExchange(), "email"), false},
		},
	}
	// Before anything is declared, the fleet's start-up check fails naming
	// what is missing: the binaries stop instead of running half-wired.
	t.Run("before the declaration", func(t *testing.T) {
		err := check(topo.WorkerUses("email"))(dial(t, mqEmail))
		if !errors.Is(err, broker.ErrTopologyMissing) || !strings.Contains(err.Error(), "queue "+topo.Queue("email")) {
			t.Errorf("the email worker's start-up check on an empty vhost: %v, want it to name %s", err, topo.Queue("email"))
		}
	})
	// The declarer first, so that the topology exists before it is used.
	for _, name := range []string{mqMigrate, mqDispatcher, mqReconciler, mqSMS, mqEmail, mqPlanner, mqOperator, mqKEDA} {
		t.Run(name, func(t *testing.T) {
			for _, s := range steps[name] {
				conn := dial(t, name)
				err := s.action(conn)
				conn.Close()
				switch {
				case s.ok && err != nil:
					t.Errorf("%s must be able to %s: %v", name, s.what, err)
				case !s.ok && err == nil:
					t.Errorf("%s must not be able to %s, but could", name, s.what)
				case !s.ok && !refused(err):
					t.Errorf("%s: %s failed, but not with ACCESS_REFUSED: %v", name, s.what, err)
				}
			}
		})
	}
}

// passwordHash must be what RabbitMQ computes, or no imported user could
// log in: base64(salt ++ SHA-256(salt ++ password)), a fresh salt each time.
func TestPasswordHash(t *testing.T) {
	t.Parallel()
	h1, h2 := passwordHash("s3cret"), passwordHash("s3cret")
	if h1 == h2 {
		t.Error("two hashes of one password are equal: the salt is not random")
	}
	raw, err := base64.StdEncoding.DecodeString(h1)
	if err != nil || len(raw) != 4+sha256.Size {
		t.Fatalf("hash %q: %d bytes, %v", h1, len(raw), err)
	}
	if sum := sha256.Sum256(append(slices.Clone(raw[:4]), "s3cret"...)); !bytes.Equal(raw[4:], sum[:]) {
		t.Error("the hash is not SHA-256(salt ++ password)")
	}
}
