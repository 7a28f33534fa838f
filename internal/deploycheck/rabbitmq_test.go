package deploycheck

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/broker"
)

// ---------------------------------------------------------------------------
// deploy/rabbitmq/definitions.json: one user per component, each limited by
// configure/write/read regexes to the exchanges and queues it uses.
//
// What RabbitMQ checks (https://www.rabbitmq.com/access-control.html):
//   exchange.declare   configure on the exchange
//   queue.declare      configure on the queue
//   queue.bind         write on the queue, read on the exchange
//   basic.publish      write on the exchange ("amq.default" for the default
//                      exchange, whatever the routing key names)
//   basic.consume/get  read on the queue
//   passive declare    nothing (KEDA reads queue depth that way)

type definitions struct {
	RabbitVersion    string           `json:"rabbit_version"`
	Vhosts           []defVhost       `json:"vhosts"`
	Users            []defUser        `json:"users"`
	Permissions      []defPermission  `json:"permissions"`
	TopicPermissions []map[string]any `json:"topic_permissions"`
	Parameters       []map[string]any `json:"parameters"`
	GlobalParameters []map[string]any `json:"global_parameters"`
	Policies         []map[string]any `json:"policies"`
	Queues           []map[string]any `json:"queues"`
	Exchanges        []map[string]any `json:"exchanges"`
	Bindings         []map[string]any `json:"bindings"`
}

type defVhost struct {
	Name string `json:"name"`
}

type defUser struct {
	Name             string   `json:"name"`
	PasswordHash     string   `json:"password_hash"`
	HashingAlgorithm string   `json:"hashing_algorithm"`
	Tags             []string `json:"tags"`
}

type defPermission struct {
	User      string `json:"user"`
	Vhost     string `json:"vhost"`
	Configure string `json:"configure"`
	Write     string `json:"write"`
	Read      string `json:"read"`
}

// The vhost and users the file must define.
const (
	mqVhost      = "nudge"
	mqMigrate    = "nudge-migrate"
	mqDispatcher = "nudge-dispatcher"
	mqReconciler = "nudge-reconciler"
	mqEmail      = "nudge-email-worker"
	mqSMS        = "nudge-sms-worker"
	mqOperator   = "nudge-operator"
	mqKEDA       = "nudge-keda"
)

func readDefinitions(file string) (definitions, error) {
	var d definitions
	data, err := os.ReadFile(file)
	if err != nil {
		return d, err
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("%s: %w", filepath.Base(file), err)
	}
	return d, nil
}

// access is one permission check: user u may (or may not) perform perm on name.
type access struct {
	perm, name string // perm: configure, write or read
	why        string
}

// mqPolicy is what each user must be able to do, and what it must not.
//
// Only nudge-migrate declares the topology (nudgectl migrate
// --declare-topology, broker.Topology.Declare): both exchanges, every
// channel's work, dead-letter and retry queues, and the bindings. Declaring a
// queue with x-dead-letter-exchange also needs read on the queue and write on
// that exchange (RabbitMQ checks it when it creates the queue, so that a
// declarer cannot siphon a queue's messages off through its dead letters).
// The fleet only checks the topology with passive declares, which need no
// permission (broker.Check), so it gets no configure at all: each user may
// publish only where its binary publishes and consume only its own queue.
// Write on a queue is denied to everyone but the declarer too: with read on
// an exchange it would let a user add bindings.
func mqPolicy(topo broker.Topology) (need, deny map[string][]access) {
	need, deny = map[string][]access{}, map[string][]access{}
	for _, ex := range []string{topo.WorkExchange(), topo.DeadExchange()} {
		need[mqMigrate] = append(need[mqMigrate], access{"configure", ex, "declares the exchange"},
			access{"read", ex, "binds queues to the exchange"})
	}
	for _, c := range topo.Channels {
		need[mqMigrate] = append(need[mqMigrate],
			access{"configure", topo.Queue(c), "declares the queue"},
			access{"write", topo.Queue(c), "binds the queue"},
			access{"read", topo.Queue(c), "declares the queue with a dead-letter exchange"},
			access{"write", topo.DeadExchange(), "declares " + topo.Queue(c) + " dead-lettering to it"},
			access{"configure", topo.DeadQueue(c), "declares the queue"},
			access{"write", topo.DeadQueue(c), "binds the queue"})
		for _, d := range topo.RetryTiers {
			need[mqMigrate] = append(need[mqMigrate],
				access{"configure", topo.RetryQueue(c, d), "declares the retry tier"},
				access{"read", topo.RetryQueue(c, d), "declares the retry tier with a dead-letter exchange"},
				access{"write", topo.WorkExchange(), "declares " + topo.RetryQueue(c, d) + " dead-lettering to it"})
		}
		deny[mqMigrate] = append(deny[mqMigrate], access{"read", topo.DeadQueue(c), "dead letters are for operators"})
	}
	fleet := []string{mqDispatcher, mqReconciler, mqEmail, mqSMS}
	all := append([]string{mqMigrate}, fleet...)
	all = append(all, mqOperator, mqKEDA)
	// Names outside the topology nobody may touch.
	foreign := []string{"nudge.other", "nudge.email.other", "other.email", "nudgeXwork", "amq.topic", "amq.direct",
		"x" + topo.WorkExchange(), topo.WorkExchange() + "x", topo.Queue("email") + ".retry.1s.x"}
	for _, u := range all {
		for _, n := range foreign {
			for _, p := range []string{"configure", "write", "read"} {
				deny[u] = append(deny[u], access{p, n, "not part of the topology"})
			}
		}
	}
	exchanges := []string{topo.WorkExchange(), topo.DeadExchange()}
	for _, u := range append(slices.Clone(fleet), mqOperator, mqKEDA) {
		for _, n := range append(topo.Queues(), exchanges...) {
			deny[u] = append(deny[u], access{"configure", n, "only the migration step declares (or deletes) the topology"})
		}
		for _, q := range topo.Queues() {
			deny[u] = append(deny[u], access{"write", q, "could bind the queue"})
		}
		for _, ex := range exchanges {
			deny[u] = append(deny[u], access{"read", ex, "could bind queues to the exchange"})
		}
	}
	for _, u := range []string{mqDispatcher, mqReconciler} {
		need[u] = append(need[u], access{"write", topo.WorkExchange(), "publishes work"})
		deny[u] = append(deny[u], access{"write", "amq.default", "publishes only through " + topo.WorkExchange()},
			access{"write", topo.DeadExchange(), "never dead-letters"})
		for _, q := range topo.Queues() {
			deny[u] = append(deny[u], access{"read", q, "publishes, never consumes"})
		}
	}
	for u, own := range map[string]string{mqEmail: "email", mqSMS: "sms"} {
		need[u] = append(need[u],
			access{"read", topo.Queue(own), "consumes its channel's queue"},
			access{"write", "amq.default", "publishes retries to the retry tiers by queue name"},
			access{"write", topo.DeadExchange(), "dead-letters what it cannot verify or keeps failing"})
		deny[u] = append(deny[u], access{"write", topo.WorkExchange(), "must not publish new work"})
		for _, q := range topo.Queues() {
			if q != topo.Queue(own) {
				deny[u] = append(deny[u], access{"read", q, "consumes only " + topo.Queue(own)})
			}
		}
	}
	for _, c := range topo.Channels {
		need[mqOperator] = append(need[mqOperator], access{"read", topo.DeadQueue(c), "inspects dead letters"})
		deny[mqOperator] = append(deny[mqOperator], access{"read", topo.Queue(c), "must not steal work"})
		for _, d := range topo.RetryTiers {
			deny[mqOperator] = append(deny[mqOperator], access{"read", topo.RetryQueue(c, d), "must not steal retries"})
		}
	}
	need[mqOperator] = append(need[mqOperator], access{"write", topo.WorkExchange(), "replays dead letters"})
	deny[mqOperator] = append(deny[mqOperator], access{"write", "amq.default", "replays through " + topo.WorkExchange()})
	for _, n := range append(topo.Queues(), exchanges...) {
		for _, p := range []string{"write", "read"} {
			deny[mqKEDA] = append(deny[mqKEDA], access{p, n, "reads queue depth by passive declare, which needs no permission"})
		}
	}
	return need, deny
}

// checkDefinitions checks definitions against the topology's real names.
func checkDefinitions(d definitions, topo broker.Topology) []error {
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf("definitions.json: "+format, a...)) }
	if !slices.ContainsFunc(d.Vhosts, func(v defVhost) bool { return v.Name == mqVhost }) {
		fail("vhost %q is not defined", mqVhost)
	}
	users := map[string]defUser{}
	for _, u := range d.Users {
		users[u.Name] = u
		if u.PasswordHash != "" {
			fail("user %s: password_hash must stay empty in the repository (set passwords at deploy time)", u.Name)
		}
		if u.HashingAlgorithm != "rabbit_password_hashing_sha256" {
			fail("user %s: hashing_algorithm %q, want rabbit_password_hashing_sha256", u.Name, u.HashingAlgorithm)
		}
		for _, tag := range u.Tags {
			if tag == "administrator" || tag == "policymaker" {
				fail("user %s: tag %s grants far more than a component needs", u.Name, tag)
			}
		}
	}
	perms := map[string]defPermission{}
	for _, p := range d.Permissions {
		if p.Vhost != mqVhost {
			fail("permission of %s in vhost %q: want %q", p.User, p.Vhost, mqVhost)
			continue
		}
		if _, ok := users[p.User]; !ok {
			fail("permission of %s: no such user", p.User)
		}
		perms[p.User] = p
	}
	need, deny := mqPolicy(topo)
	for _, u := range slices.Sorted(maps.Keys(need)) {
		if _, ok := users[u]; !ok {
			fail("user %s is not defined", u)
		}
	}
	for u := range users {
		if _, ok := perms[u]; !ok {
			fail("user %s has no permissions in vhost %s", u, mqVhost)
		}
	}
	for _, u := range slices.Sorted(maps.Keys(perms)) {
		p := perms[u]
		res := map[string]*regexp.Regexp{}
		for perm, expr := range map[string]string{"configure": p.Configure, "write": p.Write, "read": p.Read} {
			if !strings.HasPrefix(expr, "^") || !strings.HasSuffix(expr, "$") {
				fail("user %s: %s %q must be anchored with ^ and $ (RabbitMQ searches, it does not match whole names)", u, perm, expr)
			}
			re, err := regexp.Compile(expr)
			if err != nil {
				fail("user %s: %s %q: %v", u, perm, expr, err)
				re = regexp.MustCompile(`^$`)
			}
			res[perm] = re
		}
		for _, a := range need[u] {
			if !res[a.perm].MatchString(a.name) {
				fail("user %s needs %s on %s (%s), but %s is %q", u, a.perm, a.name, a.why, a.perm, res[a.perm])
			}
		}
		for _, a := range deny[u] {
			if res[a.perm].MatchString(a.name) {
				fail("user %s must not have %s on %s (%s), but %s %q matches it", u, a.perm, a.name, a.why, a.perm, res[a.perm])
			}
		}
	}
	return errs
}

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
	requireNoErrors(t, checkDefinitions(d, topo))
}

func TestRabbitMQDefinitionsCheckerCatches(t *testing.T) {
	t.Parallel()
	topo := broker.Topology{}.WithDefaults()
	for _, b := range []breakage{
		{name: "dispatcher consumes work", old: `"configure": "^$", "write": "^nudge\\.work$", "read": "^$"}`,
			new:  `"configure": "^$", "write": "^nudge\\.work$", "read": "^nudge\\.(email|sms)$"}`,
			want: "user nudge-dispatcher must not have read on nudge.email (publishes, never consumes)"},
		{name: "dispatcher writes the default exchange", old: `"configure": "^$", "write": "^nudge\\.work$"`,
			new: `"configure": "^$", "write": "^(amq\\.default|nudge\\.work)$"`, want: "user nudge-dispatcher must not have write on amq.default"},
		{name: "worker reads dead letters", old: `"read": "^nudge\\.email$"}`, new: `"read": "^nudge\\.email(\\.dead)?$"}`,
			want: "user nudge-email-worker must not have read on nudge.email.dead"},
		{name: "worker reads the other channel", old: `"read": "^nudge\\.email$"}`, new: `"read": "^nudge\\.(email|sms)$"}`,
			want: "user nudge-email-worker must not have read on nudge.sms (consumes only nudge.email)"},
		{name: "worker declares as it used to", old: `"configure": "^$", "write": "^(amq\\.default|nudge\\.dead)$"`,
			new:  `"configure": "^nudge\\.(work|dead|(email|sms)(\\.dead|\\.retry\\.[0-9hms]+)?)$", "write": "^(amq\\.default|nudge\\.dead)$"`,
			want: "user nudge-email-worker must not have configure on nudge.email (only the migration step declares (or deletes) the topology)"},
		{name: "worker cannot publish retries", old: `"write": "^(amq\\.default|nudge\\.dead)$"`, new: `"write": "^nudge\\.dead$"`,
			want: "user nudge-email-worker needs write on amq.default"},
		{name: "worker publishes new work", old: `"write": "^(amq\\.default|nudge\\.dead)$"`, new: `"write": "^(amq\\.default|nudge\\.(work|dead))$"`,
			want: "user nudge-email-worker must not have write on nudge.work"},
		{name: "worker binds its queue", old: `"write": "^(amq\\.default|nudge\\.dead)$"`, new: `"write": "^(amq\\.default|nudge\\.dead|nudge\\.email)$"`,
			want: "user nudge-email-worker must not have write on nudge.email (could bind the queue)"},
		{name: "retry tier not declarable", old: `"configure": "^nudge\\.(work|dead|(email|sms)(\\.dead|\\.retry\\.[0-9hms]+)?)$"`,
			new: `"configure": "^nudge\\.(work|dead|(email|sms)(\\.dead)?)$"`, want: "user nudge-migrate needs configure on nudge.email.retry.1s"},
		{name: "dead-letter check forgotten", old: `"read": "^nudge\\.(work|dead|(email|sms)(\\.retry\\.[0-9hms]+)?)$"}`,
			new: `"read": "^nudge\\.(work|dead|(email|sms))$"}`, want: "needs read on nudge.email.retry.1s (declares the retry tier with a dead-letter exchange)"},
		{name: "declarer reads dead letters", old: `"read": "^nudge\\.(work|dead|(email|sms)(\\.retry\\.[0-9hms]+)?)$"}`,
			new:  `"read": "^nudge\\.(work|dead|(email|sms)(\\.dead|\\.retry\\.[0-9hms]+)?)$"}`,
			want: "user nudge-migrate must not have read on nudge.email.dead"},
		{name: "no declarer", old: `{"user": "nudge-migrate", "vhost": "nudge",`, new: `{"user": "nudge-migrate", "vhost": "other",`,
			want: "user nudge-migrate has no permissions in vhost nudge"},
		{name: "unanchored", old: `"write": "^nudge\\.work$"`, new: `"write": "nudge\\.work"`, want: "must be anchored"},
		{name: "prefix match", old: `"write": "^nudge\\.work$"`, new: `"write": "^nudge\\.work"`, want: "must not have write on nudge.workx"},
		{name: "administrator", old: `"tags": ["management"]`, new: `"tags": ["administrator"]`, want: "tag administrator"},
		{name: "a password in the repository", old: `{"name": "nudge-keda", "password_hash": ""`, new: `{"name": "nudge-keda", "password_hash": "c2VjcmV0"`, want: "password_hash must stay empty"},
		{name: "unknown field", old: `"rabbit_version"`, new: `"rabbit_versoin"`, want: `unknown field "rabbit_versoin"`},
	} {
		t.Run(b.name, func(t *testing.T) {
			d, err := readDefinitions(broken(t, definitionsFile(t), b))
			if err != nil {
				wantError(t, []error{err}, b.want)
				return
			}
			wantError(t, checkDefinitions(d, topo), b.want)
		})
	}
}

// ---------------------------------------------------------------------------
// The same file, live: imported into a throwaway vhost of the local broker,
// each user does what its binary does, and is refused what it must not do.

// passwordHash is RabbitMQ's rabbit_password_hashing_sha256: base64 of a
// 4-byte salt followed by SHA-256(salt ++ password).
func passwordHash(password string) string {
	salt := make([]byte, 4)
	_, _ = rand.Read(salt)
	sum := sha256.Sum256(append(slices.Clone(salt), password...))
	return base64.StdEncoding.EncodeToString(append(salt, sum[:]...))
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// unavailable fails under CI=true and skips loudly otherwise, and skips
// under -short whatever CI says (as testenv does).
func unavailable(t *testing.T, what string, err error) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs " + what)
	}
	msg := fmt.Sprintf("INTEGRATION TEST NOT RUN: %s: %v", what, err)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip("\n\n*** " + msg + " ***\n")
}

// rabbitmqctl runs the CLI with stdin (it runs as the broker's user, which
// cannot read the test's private temporary files).
func rabbitmqctl(ctx context.Context, stdin []byte, args ...string) error {
	cmd := exec.CommandContext(ctx, "rabbitmqctl", append([]string{"-q"}, args...)...)
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// mqResult runs action on a fresh channel and returns the broker's verdict:
// nil, or the *amqp.Error that closed the channel. A refused publish closes
// the channel asynchronously; basic.qos, a synchronous round trip that needs
// no permission, surfaces it.
func mqResult(conn *amqp.Connection, action func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	err = action(ch)
	if err == nil {
		err = ch.Qos(1, 0, false)
	}
	if err == nil {
		return ch.Close()
	}
	select {
	case e := <-closed:
		if e != nil {
			return e
		}
	case <-time.After(2 * time.Second):
	}
	return err
}

func refused(err error) bool {
	var e *amqp.Error
	return errors.As(err, &e) && e.Code == amqp.AccessRefused
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
		unavailable(t, "rabbitmqctl manages the local node, but NUDGE_TEST_AMQP_URL is "+base.Redacted(), errors.New("not loopback"))
	}
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		unavailable(t, "rabbitmqctl (install rabbitmq-server, or run `make services`)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mqConfig := amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)}
	if conn, err := amqp.DialConfig(amqpURL, mqConfig); err != nil {
		unavailable(t, "RabbitMQ at "+base.Redacted(), err)
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
		unavailable(t, "importing definitions with rabbitmqctl (needs root or the broker's Erlang cookie)", err)
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
	// Each step runs on a connection of the user's own; channel steps on a
	// fresh channel each (mqResult), since a refusal closes it.
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
	retry := topo.RetryQueue("email", topo.RetryTiers[0])
	steps := map[string][]step{
		mqMigrate: {
			{"declare the topology", declare, true},
			{"declare the topology again (idempotent)", declare, true},
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
			{"publish to a retry tier", publish("", retry), true},
			{"publish to nudge.dead", publish(topo.DeadExchange(), "email"), true},
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
			{"publish to nudge.dead", publish(topo.DeadExchange(), "sms"), true},
			{"consume nudge.email", consume(topo.Queue("email")), false},
			{"consume nudge.sms.dead", consume(topo.DeadQueue("sms")), false},
			{"re-declare its own queue", declareQueue(topo.Queue("sms")), false},
			{"delete its own queue", deleteQueue(topo.Queue("sms")), false},
		},
		mqOperator: {
			{"check the whole topology (nudgectl broker check)", check(topo.AllUses()), true},
			{"consume nudge.email.dead", consume(topo.DeadQueue("email")), true},
			{"publish to nudge.work", publish(topo.WorkExchange(), "email"), true},
			{"consume nudge.email", consume(topo.Queue("email")), false},
			{"consume a retry tier", consume(retry), false},
			{"publish to a retry tier", publish("", retry), false},
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
	for _, name := range []string{mqMigrate, mqDispatcher, mqReconciler, mqSMS, mqEmail, mqOperator, mqKEDA} {
		t.Run(name, func(t *testing.T) {
			conn := dial(t, name)
			for _, s := range steps[name] {
				err := s.action(conn)
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
