//go:build race

package data

// raceDetector says the tests run under -race, which slows code 5–20×:
// time bounds mean nothing there.
const raceDetector = true
