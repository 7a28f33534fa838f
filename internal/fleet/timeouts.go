package fleet

import (
	"time"

	"github.com/nudgehq/nudge/internal/config"
)

// The session timeouts of each process's pool (config.DBTimeouts), set on
// its own connections whatever login it uses, so a statement stuck behind a
// lock or a plan gone bad fails and is retried instead of stalling the
// process. Every statement of the fleet is one bounded, batched transition
// that takes milliseconds; the bounds are far above that, and a failure is
// handled as any database error: the worker retries with back-off (its
// messages stay unacked), a dispatcher run or a reconciler pass fails and
// the next one starts afresh. lock_timeout is short because the fleet's row
// locks are held for one statement only (claims skip locked rows); a longer
// wait means something else (an operator's transaction, a migration) holds
// them. No transaction of the fleet stays idle, so a session idle in one for
// a minute is a bug or a hung client, ended by the server.
//
// The web tier (nudge_intake) gets none of these: its sessions and
// transactions are its own (Nudge's functions run inside them, beside its
// other work), and a duplicate intake of the same key waits for the first
// transaction to commit, however long that takes, so that the two converge
// on one row. docs/operations.md says what to set on logins by hand.
var (
	dispatcherTimeouts = config.DBTimeouts{Statement: 30 * time.Second, Lock: 10 * time.Second, IdleInTransaction: time.Minute}
	workerTimeouts     = config.DBTimeouts{Statement: 30 * time.Second, Lock: 10 * time.Second, IdleInTransaction: time.Minute}
	// The reconciler's retention pass deletes in batches; its gauges scan
	// the open rows.
	reconcilerTimeouts = config.DBTimeouts{Statement: 2 * time.Minute, Lock: 10 * time.Second, IdleInTransaction: time.Minute}
)
