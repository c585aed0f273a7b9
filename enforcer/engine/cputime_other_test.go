//go:build !unix

package engine

import "time"

// processCPU cannot be read here.
func processCPU() time.Duration { return -1 }
