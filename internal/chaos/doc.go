// Package chaos runs the whole fleet as separate processes under load while
// killing them, closing every broker connection and restarting PostgreSQL,
// then checks what users would: every reminder ended with a reason, nothing
// was sent at or after its deadline, nothing was sent twice where the channel
// deduplicates, and every email duplicate is explained by a kill inside the
// window between the relay accepting and the outcome being recorded.
//
// It disturbs shared services (it restarts PostgreSQL), so it runs only when
// asked: NUDGE_CHAOS=short (5,000 reminders, part of make test, after the
// other tests) or NUDGE_CHAOS=full (20,000 reminders, make chaos).
package chaos
