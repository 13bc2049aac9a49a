//go:build race

// Package racebuild says whether the binary was built with the race
// detector. Under it sync.Pool drops items at random and the detector
// allocates on its own, so tests that count allocations skip.
package racebuild

// Enabled: built with -race.
const Enabled = true
