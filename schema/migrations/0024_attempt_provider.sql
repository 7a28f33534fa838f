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
