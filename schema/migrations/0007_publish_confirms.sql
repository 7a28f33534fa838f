-- Nudge schema, version 7: publish confirmations recorded per batch.
--
-- Until version 6 a dispatched reminder was written three times before its
-- worker saw it: pending → leased (the claim), leased → enqueued (publish
-- confirmed) and → sending (the worker's claim), each a rewrite of the whole
-- row and of its index entries (no update of reminders is HOT: state is in
-- every partial index's predicate), each with an event. The middle write only
-- told the reconciler "this message is in the queue, do not republish it when
-- the dispatch lease runs out".
--
-- From this version the claim moves a row straight to enqueued, under a
-- dispatch lease (lease_until) and a batch number (dispatch_batch); once the
-- broker has confirmed the batch's messages, the dispatcher records one row
-- here for the whole batch. The reconciler then tells the two cases apart when
-- the lease runs out: an enqueued row whose batch has a confirmation is in the
-- queue (its lease is cleared, nothing else changes); one without went
-- unconfirmed (its dispatcher died between the claim and the confirms) and
-- returns to pending under a new fence. A worker that receives the message
-- needs neither: the message itself proves it was published.
--
-- State leased stays for rows written by earlier versions and by binaries of
-- an earlier version still running during a rollout: those still move leased
-- → enqueued row by row, and the reconciler still returns an expired leased row
-- to pending.

ALTER TABLE reminders ADD COLUMN dispatch_batch bigint;

-- Numbers the claims (one per ClaimDue or Reclaim statement).
CREATE SEQUENCE dispatch_batches;

CREATE TABLE publish_confirms (
    batch        bigint      PRIMARY KEY,
    confirmed_at timestamptz NOT NULL,
    actor        text        NOT NULL,
    -- How many of the batch's messages the broker confirmed (the others were
    -- returned to pending with a reason).
    confirmed    integer     NOT NULL
);
CREATE INDEX publish_confirms_at ON publish_confirms (confirmed_at);

-- The lease sweep's index, now also over enqueued rows until the reconciler
-- has resolved their dispatch lease (it clears lease_until either way).
DROP INDEX reminders_leases;
CREATE INDEX reminders_leases ON reminders (lease_until)
    WHERE state IN ('leased', 'enqueued', 'sending') AND lease_until IS NOT NULL;

-- Privileges, in the style of version 2 (column by column, per component).
-- The dispatcher claims and confirms; the reconciler republishes (the same
-- claim and confirm) and resolves leases; operators read; retention deletes
-- old confirmations.
GRANT SELECT (dispatch_batch), UPDATE (dispatch_batch) ON reminders TO nudge_dispatcher, nudge_reconciler;
GRANT SELECT (enqueued_at) ON reminders TO nudge_dispatcher;
GRANT USAGE ON SEQUENCE dispatch_batches TO nudge_dispatcher, nudge_reconciler;
GRANT INSERT ON publish_confirms TO nudge_dispatcher, nudge_reconciler;
GRANT SELECT ON publish_confirms TO nudge_reconciler, nudge_operator, nudge_retention;
GRANT DELETE ON publish_confirms TO nudge_retention;
