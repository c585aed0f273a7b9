//go:build !unix

package main

import "time"

// processCPU is unknown (-1) where getrusage is not available.
func processCPU() time.Duration { return -1 }
