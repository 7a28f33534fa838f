package worker

import (
	"context"
	"sync"
	"time"

	"github.com/nudgehq/nudge/internal/provider"
)

// sendCtx is the context of one provider call: the batch's context bounded
// by the send's deadline (the send timeout or the reminder's deadline,
// whichever comes first). It replaces a context.WithTimeout per send, which
// cost a timer, a registration in the batch context's children (a mutex
// and a map insert and delete shared by every send of the process) and
// four allocations, and, for an adapter that watched it with
// context.AfterFunc, as much again.
//
// It lives in the send's item and costs nothing until used: Deadline and
// Err read fields and the clock, and a timer is armed only when someone
// calls Done (or AfterFunc): a provider that bounds its request by the
// deadline itself (a connection deadline) and asks only for cancellation
// (provider.CancelWatcher) never arms one. The batch context's
// cancellation (the grace period running out at shutdown) reaches every
// send that asked through one sendWatch per batch, not a goroutine or a
// registration per send.
//
// context.Cause of a sendCtx is the batch context's cause: the deadline has
// none of its own.
type sendCtx struct {
	parent   context.Context // the batch context: values and cancellation
	watch    *sendWatch
	deadline time.Time // wall clock: when the send is cut

	mu       sync.Mutex
	err      error                // set once, when the context ends
	done     chan struct{}        // made by the first Done; closed when err is set
	timer    *time.Timer          // armed by the first Done, for the deadline
	onCancel provider.Interrupter // provider.CancelWatcher's request
	afters   []*afterFunc         // context.AfterFunc's functions
	joined   bool                 // joined watch (it may have left since)

	// watch's list, under watch.mu
	listed     bool
	prev, next *sendCtx
}

var (
	_ context.Context                            = (*sendCtx)(nil)
	_ provider.CancelWatcher                     = (*sendCtx)(nil)
	_ interface{ AfterFunc(func()) func() bool } = (*sendCtx)(nil)
)

// afterFunc is one function registered with sendCtx.AfterFunc.
type afterFunc struct {
	f    func()
	once sync.Once
}

// start makes c the context of a send under parent, cut at deadline (a
// wall-clock instant) or when watch's batch context ends. It resets
// whatever an earlier send left in c.
func (c *sendCtx) start(parent context.Context, watch *sendWatch, deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.parent, c.watch, c.deadline = parent, watch, deadline
	c.err, c.done, c.timer, c.onCancel, c.afters, c.joined = nil, nil, nil, nil, nil, false
}

// Deadline is the send's deadline.
func (c *sendCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Value is the batch context's.
func (c *sendCtx) Value(key any) any { return c.parent.Value(key) }

// Err is nil while the send may go on; context.DeadlineExceeded once the
// deadline has passed (on the wall clock, whether or not a timer was armed);
// the batch context's error once it ended. The first non-nil answer stays.
func (c *sendCtx) Err() error {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.check()
}

// check ends the context if its batch context ended or its deadline passed,
// and returns its error (nil: it goes on).
func (c *sendCtx) check() error {
	if err := c.parent.Err(); err != nil {
		c.end(err, true)
	} else if !time.Now().Before(c.deadline) {
		c.end(context.DeadlineExceeded, false)
	} else {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Done is closed when the context ends. The first call arms the deadline's
// timer and joins the batch's watch.
func (c *sendCtx) Done() <-chan struct{} {
	c.mu.Lock()
	if c.done != nil {
		d := c.done
		c.mu.Unlock()
		return d
	}
	c.done = make(chan struct{})
	d := c.done
	if c.err != nil {
		close(d)
		c.mu.Unlock()
		return d
	}
	c.armLocked()
	c.mu.Unlock()
	_ = c.check() // it may have ended before it joined the watch
	return d
}

// armLocked arms the deadline's timer and joins the watch, once each.
func (c *sendCtx) armLocked() {
	if c.timer == nil {
		c.timer = time.AfterFunc(time.Until(c.deadline), c.expire)
	}
	c.joinLocked()
}

// joinLocked joins the batch's watch, once.
func (c *sendCtx) joinLocked() {
	if c.watch != nil && !c.joined {
		c.joined = true
		c.watch.add(c)
	}
}

// expire ends the context at its deadline.
func (c *sendCtx) expire() { c.end(context.DeadlineExceeded, false) }

// end records err as why the context ended, if it had not ended yet, and
// tells whoever waits: Done's channel is closed, AfterFunc's functions
// start, and the CancelWatcher's request is interrupted when the batch context
// ended it (byParent). A context that ended leaves the watch.
func (c *sendCtx) end(err error, byParent bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	if c.joined {
		c.watch.remove(c) // before Done closes: a closed Done has left the watch
	}
	if c.done != nil {
		close(c.done)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	afters, onCancel := c.afters, c.onCancel
	c.afters, c.onCancel = nil, nil
	c.mu.Unlock()
	for _, a := range afters {
		go a.once.Do(a.f)
	}
	if onCancel != nil && byParent {
		onCancel.Interrupt()
	}
}

// release ends the send's context once the provider call returned, as a
// context.WithTimeout's cancel would: its timer stops and it leaves the watch.
func (c *sendCtx) release() { c.end(context.Canceled, false) }

// AfterFunc runs f on its own goroutine once the context ends (its deadline
// or the batch context's end), as context.AfterFunc does; stop undoes it.
// context.AfterFunc and context.WithTimeout on a sendCtx use it, so that
// they start no goroutine to watch it.
func (c *sendCtx) AfterFunc(f func()) (stop func() bool) {
	a := &afterFunc{f: f}
	stop = func() bool {
		stopped := false
		a.once.Do(func() { stopped = true })
		c.mu.Lock()
		for i, x := range c.afters {
			if x == a {
				c.afters = append(c.afters[:i], c.afters[i+1:]...)
				break
			}
		}
		c.mu.Unlock()
		return stopped
	}
	c.mu.Lock()
	if c.err == nil {
		c.afters = append(c.afters, a)
		c.armLocked()
		c.mu.Unlock()
		_ = c.check()
		return stop
	}
	c.mu.Unlock()
	go a.once.Do(f)
	return stop
}

// WatchCancel interrupts r when the batch context ends (the worker's grace
// period ran out) before StopWatching; it arms no timer: the caller
// enforces Deadline itself. If the context has already ended, r is
// interrupted at once.
func (c *sendCtx) WatchCancel(r provider.Interrupter) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		r.Interrupt()
		return
	}
	c.onCancel = r
	c.joinLocked()
	c.mu.Unlock()
	if err := c.parent.Err(); err != nil {
		c.end(err, true) // it may have ended before it joined the watch
	}
}

// StopWatching undoes WatchCancel; it reports whether it did so before the
// request was interrupted (false: it was, or is being, or the context ended).
func (c *sendCtx) StopWatching() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	stopped := c.onCancel != nil || c.err == nil
	c.onCancel = nil
	return stopped
}

// sendWatch ends the contexts of a batch's sends when the batch context
// ends: one context.AfterFunc on the batch context per batch, instead of
// one registration per send. A sendCtx joins it only when someone waits
// on it (Done, AfterFunc, WatchCancel).
type sendWatch struct {
	parent context.Context
	stop   func() bool

	mu    sync.Mutex
	head  *sendCtx // the contexts listed, linked through prev and next
	ended bool
}

// newSendWatch watches parent for the sends of one batch; close stops it.
func newSendWatch(parent context.Context) *sendWatch {
	w := &sendWatch{parent: parent}
	w.stop = context.AfterFunc(parent, w.cancelAll)
	return w
}

// close stops watching; the batch's sends have returned.
func (w *sendWatch) close() { w.stop() }

// add lists c (c.mu held). A context listed after the batch context ended is ended
// by its own check of the parent, which every caller makes after joining.
func (w *sendWatch) add(c *sendCtx) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return
	}
	c.listed = true
	c.prev, c.next = nil, w.head
	if w.head != nil {
		w.head.prev = c
	}
	w.head = c
}

// remove unlists c (c.mu held: the order is c.mu, then w.mu).
func (w *sendWatch) remove(c *sendCtx) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !c.listed {
		return
	}
	c.listed = false
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		w.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	c.prev, c.next = nil, nil
}

// cancelAll ends every listed context with the batch context's error.
func (w *sendWatch) cancelAll() {
	err := w.parent.Err()
	w.mu.Lock()
	w.ended = true
	var list []*sendCtx
	for c := w.head; c != nil; {
		next := c.next
		list = append(list, c)
		c.listed, c.prev, c.next = false, nil, nil
		c = next
	}
	w.head = nil
	w.mu.Unlock()
	for _, c := range list {
		c.end(err, true)
	}
}
