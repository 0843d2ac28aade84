//go:build !race

package data

// raceDetector says the tests run under -race (see race_on_test.go).
const raceDetector = false
