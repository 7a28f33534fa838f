-- Nudge schema, version 8: retention removes idle rate-limit flows.
--
-- rate_flows (version 6) gets a row the first time a tenant sends through a
-- provider account, and every reservation on the account reads all of its
-- rows to share the account fairly. Tenants that stopped sending would make
-- that read grow for ever; the retention pass deletes a flow idle for a day
-- (its last ask, its pacing state and its last deferred turn all that old).
-- A flow that asks again gets a fresh row, as a new tenant does.
GRANT SELECT, DELETE ON rate_flows TO nudge_retention;
