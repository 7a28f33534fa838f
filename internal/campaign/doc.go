// Package campaign plans renewal campaigns: it turns an audience (a table or
// view of the application's database) into reminders a slice at a time,
// through the queue rather than in one long cron run (issue 15, and the
// first article in seeds: cron is a nudge, the queue is the work ledger).
//
// Each slice is driven by a signed planning command on the planning queue
// (pseudo-channel "plan", signed with its own derived key, internal/message).
// The planner locks the campaign row (its lease: the lock ends with the
// transaction or with a killed planner's session, and the transaction is
// bounded by the campaign's lease), checks the command's fence against the
// campaign's, reads at most one slice of audience rows after the cursor,
// schedules them through the bulk intake statement with the stable keys
// campaign:<id>:<audience key>, and stores the next cursor, the counts and a
// checkpoint row in the same transaction. Only then does it publish the
// continuation (confirmed) and acknowledge the command. So a killed planner
// resumes from its last checkpoint, a replayed or duplicated command finds
// the fence moved on and writes nothing, and a delayed planner cannot write
// over the one that took its place.
//
// What to do with a command is decided by Decide, a pure function of the
// campaign, the command and the clock; the effects live in Planner.
package campaign
