// Package upgrade tests a rolling upgrade: the binaries of the last release
// (OldRelease, built from git) run a fleet on the schema their nudgectl
// migrated; while they deliver, this tree's nudgectl migrates, and the fleet
// is replaced in the order docs/deploy.md gives for this release (the
// claimers, dispatcher, workers and reconciler, as a group: every old one
// stopped, then every new one started, on the same schema and queues), while
// both releases' nudgectl schedule and cancel throughout. Once no old
// component is left, the after-rollout step (nudgectl migrate
// --after-rollout; in this release: lazy intake on and reminder_state's
// foreign key dropped (44), the old expiry and terminal indexes dropped (45,
// 48), envelopes of up to 200 allowed (49)) runs under the new fleet, which goes on scheduling, canceling
// and delivering, reminders left lazy by either release's intake among them
// (the old release's nudgectl stands for an application not yet relinked).
// It then checks what users and operators would see: every reminder terminal
// with a reason, nothing sent twice or after its deadline by the provider's
// own record, timelines that read whole through the new nudgectl, dead
// letters that explain themselves, and no SQL error from any binary.
//
// Today's tree only differs from OldRelease by what has landed since; a
// change of schema or message format that the old binaries cannot live with
// turns it red. Move OldRelease at each release.
package upgrade
