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
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/nudgehq/nudge/internal/broker"
)

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

// definitions is the file, decoded strictly: RabbitMQ ignores a field it
// does not know, so a misspelt one would silently grant nothing.
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
	mqWebhook    = "nudge-webhook-worker"
	mqPlanner    = "nudge-planner"
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
// --declare-topology, broker.Topology.Declare): the work and dead-letter
// exchanges, each channel's retry exchange, every channel's work,
// dead-letter and retry queues, and the bindings. Declaring a
// queue with x-dead-letter-exchange also needs read on the queue and write on
// that exchange (RabbitMQ checks it when it creates the queue, so that a
// declarer cannot siphon a queue's messages off through its dead letters).
// The fleet only checks the topology with passive declares, which need no
// permission (broker.Check), so it gets no configure at all: each user may
// publish only where its binary publishes and consume only its own queue.
// Write on a queue is denied to everyone but the declarer too: with read on
// an exchange it would let a user add bindings. A worker publishes its
// retries through its channel's retry exchange, never the default exchange
// (amq.default), which reaches every queue by name: with it, the SMS worker
// could put work in the email queue and its retry tiers.
func mqPolicy(topo broker.Topology) (need, deny map[string][]access) {
	need, deny = map[string][]access{}, map[string][]access{}
	for _, ex := range []string{topo.WorkExchange(), topo.DeadExchange()} {
		need[mqMigrate] = append(need[mqMigrate], access{"configure", ex, "declares the exchange"},
			access{"read", ex, "binds queues to the exchange"})
	}
	for _, c := range topo.Channels {
		need[mqMigrate] = append(need[mqMigrate],
			access{"configure", topo.RetryExchange(c), "declares the exchange"},
			access{"read", topo.RetryExchange(c), "binds the retry tiers to the exchange"},
			access{"configure", topo.Queue(c), "declares the queue"},
			access{"write", topo.Queue(c), "binds the queue"},
			access{"read", topo.Queue(c), "declares the queue with a dead-letter exchange"},
			access{"write", topo.DeadExchange(), "declares " + topo.Queue(c) + " dead-lettering to it"},
			access{"configure", topo.DeadQueue(c), "declares the queue"},
			access{"write", topo.DeadQueue(c), "binds the queue"})
		for _, d := range topo.RetryTiers {
			need[mqMigrate] = append(need[mqMigrate],
				access{"configure", topo.RetryQueue(c, d), "declares the retry tier"},
				access{"write", topo.RetryQueue(c, d), "binds the retry tier"},
				access{"read", topo.RetryQueue(c, d), "declares the retry tier with a dead-letter exchange"},
				access{"write", topo.WorkExchange(), "declares " + topo.RetryQueue(c, d) + " dead-lettering to it"})
		}
		deny[mqMigrate] = append(deny[mqMigrate], access{"read", topo.DeadQueue(c), "dead letters are for operators"})
	}
	fleet := []string{mqDispatcher, mqReconciler, mqEmail, mqSMS, mqWebhook, mqPlanner}
	all := append([]string{mqMigrate}, fleet...)
	all = append(all, mqOperator, mqKEDA)
	// Names outside the topology nobody may touch.
	foreign := []string{"nudge.other", "nudge.email.other", "other.email", "nudgeXwork", "amq.topic", "amq.direct",
		"x" + topo.WorkExchange(), topo.WorkExchange() + "x", topo.Queue("email") + ".retry.1s.x",
		topo.RetryExchange("email") + "x", topo.Queue("email") + ".retryx"}
	for _, u := range all {
		for _, n := range foreign {
			for _, p := range []string{"configure", "write", "read"} {
				deny[u] = append(deny[u], access{p, n, "not part of the topology"})
			}
		}
	}
	exchanges := topo.Exchanges()
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
		for _, c := range topo.Channels {
			deny[u] = append(deny[u], access{"write", topo.RetryExchange(c), "never retries"})
		}
		for _, q := range topo.Queues() {
			deny[u] = append(deny[u], access{"read", q, "publishes, never consumes"})
		}
	}
	for u, own := range map[string]string{mqEmail: "email", mqSMS: "sms", mqWebhook: "webhook"} {
		need[u] = append(need[u],
			access{"read", topo.Queue(own), "consumes its channel's queue"},
			access{"write", topo.RetryExchange(own), "publishes retries to its channel's retry tiers"},
			access{"write", topo.DeadExchange(), "dead-letters what it cannot verify or keeps failing"})
		deny[u] = append(deny[u], access{"write", topo.WorkExchange(), "must not publish new work"},
			access{"write", "amq.default", "reaches every queue by name, other channels' included: retries go through " + topo.RetryExchange(own)})
		for _, c := range topo.Channels {
			if c != own {
				deny[u] = append(deny[u], access{"write", topo.RetryExchange(c), "must not act on another channel's work"})
			}
		}
		for _, q := range topo.Queues() {
			if q != topo.Queue(own) {
				deny[u] = append(deny[u], access{"read", q, "consumes only " + topo.Queue(own)})
			}
		}
	}
	// The campaign planner (internal/campaign): consumes the planning queue,
	// publishes continuations through the work exchange; its rejects are
	// dead-lettered by the broker, which needs no permission of its own.
	plan := topo.Planning()
	need[mqMigrate] = append(need[mqMigrate],
		access{"configure", plan.Queue(broker.PlanChannel), "declares the planning queue"},
		access{"configure", plan.DeadQueue(broker.PlanChannel), "declares the planning dead-letter queue"},
		access{"configure", plan.RetryExchange(broker.PlanChannel), "declares the planning retry exchange"})
	need[mqPlanner] = append(need[mqPlanner],
		access{"read", plan.Queue(broker.PlanChannel), "consumes planning commands"},
		access{"write", plan.WorkExchange(), "publishes continuations"})
	deny[mqPlanner] = append(deny[mqPlanner],
		access{"write", "amq.default", "reaches every queue by name: continuations go through " + plan.WorkExchange()},
		access{"write", plan.DeadExchange(), "never dead-letters itself (rejects do)"},
		access{"write", plan.RetryExchange(broker.PlanChannel), "gives commands back by nack, never retries"},
		access{"read", plan.DeadQueue(broker.PlanChannel), "dead letters are for operators"},
		access{"configure", plan.Queue(broker.PlanChannel), "only the migration step declares (or deletes) the topology"})
	for _, q := range topo.Queues() {
		deny[mqPlanner] = append(deny[mqPlanner], access{"read", q, "consumes only " + plan.Queue(broker.PlanChannel)})
	}
	for _, u := range []string{mqDispatcher, mqReconciler, mqEmail, mqSMS, mqWebhook, mqOperator} {
		deny[u] = append(deny[u], access{"read", plan.Queue(broker.PlanChannel), "only planners consume planning commands"})
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
	for _, c := range topo.Channels {
		deny[mqOperator] = append(deny[mqOperator], access{"write", topo.RetryExchange(c), "replays through " + topo.WorkExchange()})
	}
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

// What the live test of the same file needs (rabbitmq_test.go): it is imported
// into a throwaway vhost of the local broker, and each user does what its
// binary does and is refused what it must not do.

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
