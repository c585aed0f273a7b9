//go:build !unix

package bench

import "time"

// ProcessCPU is unknown (-1) where getrusage is not available.
func ProcessCPU() time.Duration { return -1 }
