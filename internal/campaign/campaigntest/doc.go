// Package campaigntest plans real campaigns for the tests of the packages
// that show or measure them (nudgectl campaign status, the console, the
// planner's metrics): an audience table in the test's schema, a planning
// queue of the test's own on the local broker, and a planner that runs
// slices through the real statements, so what those tests read is what a
// planned campaign leaves behind.
package campaigntest
