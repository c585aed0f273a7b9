package rules

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// measureCPU reports, besides ns/op (wall time, which on a shared machine
// includes waiting for a CPU), cpu-ns/op: the CPU time the benchmark's own
// thread spent per op. Call it before the loop and the function it returns
// after it.
func measureCPU(b *testing.B) (done func()) {
	runtime.LockOSThread()
	start := threadCPU()
	return func() {
		used := threadCPU() - start
		runtime.UnlockOSThread()
		if b.N > 0 {
			b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/op")
		}
	}
}

func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
