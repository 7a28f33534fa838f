// Package faults marks the dual-write windows of the pipeline (the moments
// where one system has changed and the other not yet) so tests can crash a
// real process exactly there. In a normal build Inject compiles to nothing;
// a binary built with -tags faultinject kills itself with SIGKILL at the point
// named by NUDGE_FAULT, which is how the failure inventory is tested with
// real crashes rather than simulated ones.
package faults

// The points, each between two writes that cannot be made atomic.
const (
	// DispatcherAfterPublish: the broker confirmed the messages; their batch's
	// publish confirmation is not recorded. The claim already moved the rows
	// to enqueued under a dispatch lease (schema 7), so when the lease runs
	// out the reconciler, finding no confirmation, returns them to pending.
	DispatcherAfterPublish = "dispatcher-after-publish"
	// WorkerAfterClaim: attempts are claimed (sending); nothing was sent.
	WorkerAfterClaim = "worker-after-claim"
	// WorkerAfterSend: the provider answered; the outcome is not recorded.
	WorkerAfterSend = "worker-after-send"
	// WorkerAfterRecord: the outcome is recorded; the message is not acked.
	WorkerAfterRecord = "worker-after-record"
)

// Inject crashes the process at point when fault injection is compiled in
// and NUDGE_FAULT names point; otherwise it does nothing.
func Inject(point string) { inject(point) }
