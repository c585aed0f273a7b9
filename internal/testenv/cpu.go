package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ProcessCPU returns the user and system CPU time process pid used so far,
// from /proc (clock ticks of 10 ms); 0 where /proc is not there.
func ProcessCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses.
	i := strings.LastIndexByte(string(data), ')')
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// PostgresCPU returns the CPU time the processes named postgres on this
// machine used so far: the test database's, when it runs here.
func PostgresCPU() time.Duration {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var sum time.Duration
	for _, d := range dirs {
		if comm, err := os.ReadFile(d + "/comm"); err == nil && strings.TrimSpace(string(comm)) == "postgres" {
			pid, _ := strconv.Atoi(filepath.Base(d))
			sum += ProcessCPU(pid)
		}
	}
	return sum
}

// WriteCalls returns the write system calls this process made so far,
// from /proc/self/io.
func WriteCalls() (int64, error) { return procIO("syscw") }

// WrittenBytes returns the bytes this process wrote so far (to sockets,
// files and pipes), from /proc/self/io.
func WrittenBytes() (int64, error) { return procIO("wchar") }

// procIO returns the counter named field of /proc/self/io.
func procIO(field string) (int64, error) {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, field+": "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, os.ErrNotExist
}
