-- Nudge schema, version 24: which provider each attempt went to (issue 16).
--
-- With provider failover (schema version 19) an SMS attempt may go to any of
-- the channel's providers. An attempt whose outcome is unknown (no answer
-- came, or its worker died mid-send) is settled by asking the provider that
-- may hold its message, and only that one: the worker records the provider
-- when it claims the attempt (ClaimForDelivery), and again before the
-- request leaves when failover sends it elsewhere (AttemptProvider: a probe
-- of the first provider, or a switch between the claim and the send), so
-- the record is right even when the worker is killed mid-send. NULL: an
-- attempt from before this version, or of a channel with one provider that
-- does not name itself (email); a lookup then asks every provider in order.
ALTER TABLE delivery_attempts ADD COLUMN provider text;

GRANT SELECT (provider), INSERT (provider), UPDATE (provider) ON delivery_attempts TO nudge_worker;

-- The reconciler settles, by the same lookup, a reminder whose deadline has
-- passed while an attempt's outcome is unknown (UnknownAtDeadline,
-- SettledByLookup): it reads the attempts and what a lookup needs.
GRANT SELECT (provider, provider_message_id, started_at) ON delivery_attempts TO nudge_reconciler;
GRANT SELECT (recipient) ON reminders TO nudge_reconciler;

-- Twilio status callbacks (sms-worker --twilio-callback-listen): the latest
-- delivery status Twilio reported for each message, by its SID, which is the
-- attempt's provider_message_id (join on it: docs/operations.md). A report
-- only moves a message's status forward (rank: queued 1, sending 2, sent 3,
-- delivered, undelivered or failed 4, read 5), since callbacks may arrive
-- out of order; the reminder itself is never moved by one. Keyed by SID
-- rather than stored on the attempt, because Twilio's first callback may
-- arrive before the worker has recorded the SID. Retention deletes rows
-- after the payload window.
CREATE TABLE sms_message_status (
    message_sid text        PRIMARY KEY,
    status      text        NOT NULL,
    rank        smallint    NOT NULL,
    error_code  integer,
    reported_at timestamptz NOT NULL
);
CREATE INDEX sms_message_status_reported ON sms_message_status (reported_at);

GRANT SELECT, INSERT, UPDATE ON sms_message_status TO nudge_worker;
GRANT SELECT, DELETE ON sms_message_status TO nudge_retention;
GRANT SELECT ON sms_message_status TO nudge_operator;
