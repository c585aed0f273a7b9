package main

import (
	"bytes"
	"context"
	"testing"
)

// The flags' bounds and the target's checks refuse a run before it starts
// (internal/bench tests the load itself).
func TestBenchRefusesBadTargets(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--target", "203.0.113.9:8082"},
		{"--transport", "http", "--target", "http://example.com:8081"},
		{"--transport", "http", "--target", "127.0.0.1:8081"},
		{"--transport", "smtp"},
		{"--concurrency", "0"},
		{"--duration", "11m"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"bench", "--duration", "1ms"}, args...), func(string) string { return "" }, &out, &errOut)
		if err == nil {
			t.Errorf("bench %v: ran, want refused", args)
		}
	}
}
