//go:build !faultinject

package faults

func inject(string) {}
