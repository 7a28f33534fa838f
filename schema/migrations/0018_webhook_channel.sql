-- Nudge schema, version 18: the webhook channel (issue 16).
--
-- A webhook reminder is an HTTP request the webhook worker makes to an
-- application: a cleanup job ("DELETE https://app.internal/learners/42/drafts/7")
-- or any callback. Its row says:
--
--   recipient  the target URL, http or https, at most 254 characters, with no
--              user info and no fragment;
--   template   the action's name, sent in the Nudge-Action header;
--   data       {"method": "DELETE" | "POST" | "PUT", "body": <any JSON>}, both
--              optional: the method defaults to DELETE, and a body (sent as
--              JSON) needs POST or PUT. No other key is accepted, so that a
--              misspelt "Method" is refused at intake instead of turning a
--              POST into a DELETE.
--
-- Which hosts a tenant may target is not the schema's business: the webhook
-- worker's targets file lists them per tenant (docs/operations.md), and the
-- worker refuses any other host, and loopback, link-local and private
-- addresses unless the tenant's entry allows them.
--
-- 1. reminders.channel admits 'webhook'.
ALTER TABLE reminders DROP CONSTRAINT reminders_channel_check;
ALTER TABLE reminders ADD CONSTRAINT reminders_channel_check CHECK (channel IN ('email', 'sms', 'webhook'));

-- 2. nudge_invalid learns the webhook channel by wrapping the function it
--    replaces (renamed nudge_invalid_email_sms), whatever earlier migrations
--    made of it: every field but the recipient is checked by it as for an
--    email reminder (a fixed placeholder address stands in for the URL), then
--    the URL and the data's method and body by nudge_invalid_webhook. Both
--    are single SQL expressions, so the bulk intake statement still inlines
--    the whole check.
ALTER FUNCTION nudge_invalid(text, text, text, text, text, jsonb, timestamptz, timestamptz)
    RENAME TO nudge_invalid_email_sms;

CREATE FUNCTION nudge_invalid_webhook(p_recipient text, p_data jsonb)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_recipient IS NULL OR btrim(p_recipient) = '' THEN ARRAY['recipient', 'is required']
        -- Before the pattern, so that it never scans a huge string.
        WHEN length(p_recipient) > 254 THEN ARRAY['recipient', 'must be at most 254 characters']
        WHEN p_recipient !~ '^https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?([/?][^\s#]*)?$'
            THEN ARRAY['recipient', 'must be an http or https URL without user info or fragment, '
                                    'like https://app.example.com/learners/42/drafts/7']
        WHEN p_data ? 'method' AND (jsonb_typeof(p_data -> 'method') IS DISTINCT FROM 'string'
                                    OR p_data ->> 'method' NOT IN ('DELETE', 'POST', 'PUT'))
            THEN ARRAY['data', 'method must be "DELETE", "POST" or "PUT"']
        WHEN p_data ? 'body' AND coalesce(p_data ->> 'method', 'DELETE') = 'DELETE'
            THEN ARRAY['data', 'a body needs method "POST" or "PUT"']
        WHEN p_data - 'method' - 'body' <> '{}'::jsonb
            THEN ARRAY['data', 'may hold only "method" and "body" for a webhook']
    END
$$;

CREATE FUNCTION nudge_invalid(
    p_tenant text, p_key text, p_channel text, p_recipient text, p_template text,
    p_data jsonb, p_due_at timestamptz, p_deadline timestamptz)
RETURNS text[] LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_channel IN ('email', 'sms')
            THEN nudge_invalid_email_sms(p_tenant, p_key, p_channel, p_recipient, p_template, p_data, p_due_at, p_deadline)
        WHEN p_channel = 'webhook'
            THEN coalesce(nudge_invalid_email_sms(p_tenant, p_key, 'email', 'webhook@recipient.invalid', p_template,
                                                  p_data, p_due_at, p_deadline),
                          nudge_invalid_webhook(p_recipient, p_data))
        -- An unknown channel: the tenant and key are reported first, as before.
        WHEN (nudge_invalid_email_sms(p_tenant, p_key, 'email', 'webhook@recipient.invalid', p_template,
                                      p_data, p_due_at, p_deadline))[1] IN ('tenant', 'key')
            THEN nudge_invalid_email_sms(p_tenant, p_key, 'email', 'webhook@recipient.invalid', p_template,
                                         p_data, p_due_at, p_deadline)
        ELSE ARRAY['channel', 'must be "email", "sms" or "webhook"']
    END
$$;
