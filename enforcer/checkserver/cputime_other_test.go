//go:build !unix

package checkserver_test

import "time"

// processCPU cannot be read here.
func processCPU() time.Duration { return -1 }
