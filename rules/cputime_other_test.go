//go:build !linux

package rules

import "testing"

// measureCPU reports CPU time per op only on Linux.
func measureCPU(*testing.B) (done func()) { return func() {} }
