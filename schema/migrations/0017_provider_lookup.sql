-- Nudge schema, version 17: unknown outcomes settled at the provider (issue 16).
--
-- Before it retries an attempt whose outcome is unknown (no answer came, or
-- its worker died mid-send), or lets such a reminder expire, the worker asks
-- the provider whether it holds the message (a provider such as Twilio does
-- not deduplicate a repeated send). It needs the attempt's start (the
-- lookup's time window) and the provider's message id when one was recorded.
GRANT SELECT (provider_message_id, started_at) ON delivery_attempts TO nudge_worker;
