package rules

import (
	"strconv"
	"strings"
)

// Problem is one thing wrong with a domain's configuration.
//
// Line and Column are 1-based; both are 0 when the problem has no position
// (Compile's problems, which come from a Domain rather than from YAML).
// Path names the offending field, like descriptors[1].rate_limit.unit; it is
// empty for problems about the file as a whole.
type Problem struct {
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
}

// String formats p as "FILE:LINE:COLUMN: path: message", leaving out the
// parts p does not have.
func (p Problem) String() string {
	var b strings.Builder
	if p.File != "" {
		b.WriteString(p.File)
		b.WriteByte(':')
	}
	if p.Line > 0 {
		b.WriteString(strconv.Itoa(p.Line))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(p.Column))
		b.WriteByte(':')
	}
	if b.Len() > 0 {
		b.WriteByte(' ')
	}
	if p.Path != "" {
		b.WriteString(p.Path)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// ValidationError is returned for an invalid configuration. It carries every
// problem found, in the order they appear in the file.
type ValidationError struct {
	Problems []Problem
}

// Error lists the problems, one per line.
func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Details returns the problems, for API error bodies.
func (e *ValidationError) Details() []Problem {
	return e.Problems
}
