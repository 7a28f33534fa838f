// Package lint holds repository-wide checks that run as tests, so a package
// without documentation fails CI the same way a broken guarantee does.
package lint
