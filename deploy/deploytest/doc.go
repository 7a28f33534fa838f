// Package deploytest lets the tests of the deployment checks prove that each
// check can fail: a Breakage copies a real deployment file (or a directory of
// them) to a temporary directory, plants one mistake in the copy, and names
// the error the check must then report.
//
// It exists outside internal/ for the same reason as deploy/manifest: the
// main module's internal/deploycheck and the separate module deploy/check
// (which requires the main module through a replace directive) share it
// instead of keeping copies. It imports the standard library only.
package deploytest
