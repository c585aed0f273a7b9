package rules

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// badText finds the first byte sequence the YAML reader refuses (invalid
// UTF-8, control characters). yaml.v3 reports those without a position.
func badText(src []byte) (line, col int, msg string) {
	line, col = 1, 1
	for i := 0; i < len(src); {
		if b := src[i]; 0x20 <= b && b <= 0x7E || b == '\t' {
			// Printable ASCII, most of any file: skip the slow checks.
			col++
			i++
			continue
		}
		if n := lineBreak(src, i); n > 0 {
			line, col = line+1, 1
			i += n
			continue
		}
		r, size := utf8.DecodeRune(src[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return line, col, "invalid UTF-8: the file must be UTF-8 text"
		case !yamlRune(r):
			return line, col, fmt.Sprintf("character %U is not allowed in YAML", r)
		}
		col++
		i += size
	}
	return 0, 0, ""
}

// lineBreak returns the length of the line break at src[i:], or 0. Like
// yaml.v3, whose positions ours must agree with, it takes CR LF, CR, LF, NEL,
// LS and PS for breaks.
func lineBreak(src []byte, i int) int {
	rest := src[i:]
	switch {
	case bytes.HasPrefix(rest, []byte("\r\n")):
		return 2
	case rest[0] == '\r', rest[0] == '\n':
		return 1
	case bytes.HasPrefix(rest, []byte("\u0085")):
		return 2
	case bytes.HasPrefix(rest, []byte("\u2028")), bytes.HasPrefix(rest, []byte("\u2029")):
		return 3
	}
	return 0
}

// yamlRune reports whether YAML allows r in a document (YAML 1.2 §5.1).
func yamlRune(r rune) bool {
	return r == '\t' || r == '\n' || r == '\r' || 0x20 <= r && r <= 0x7E || r == 0x85 ||
		0xA0 <= r && r <= 0xD7FF || 0xE000 <= r && r <= 0xFFFD || 0x10000 <= r && r <= 0x10FFFF
}

// syntaxProblem turns a yaml.v3 parse error into a position and a message.
//
// yaml.v3 names the line where the enclosing block started, and for parser
// errors the line before that, rather than where the problem is: a bad indent
// on line 9 of a list that starts on line 3 is reported at line 2 (and an
// error on line 1 gets no line at all). So the line is found again: it is the
// first line such that the document cut after it fails with the same message.
func syntaxProblem(src []byte, err error) (line, col int, msg string) {
	line, msg = yamlMessage(err)
	if name, ok := strings.CutPrefix(msg, "unknown anchor '"); ok {
		// An alias to nothing; aliases are refused anyway, so say that.
		name, _, _ = strings.Cut(name, "'")
		line, col = findAlias(src, name)
		return line, col, fmt.Sprintf("aliases (*%s) are not supported; write the value out", name)
	}
	ends := lineEnds(src)
	first, last := findErrorLine(src, ends, msg, max(line, 1))
	col, hint := culprit(lineText(src, ends, last), msg)
	if first < last {
		// Out of search budget: give the range the error is in.
		return first, 1, fmt.Sprintf("YAML syntax error in lines %d to %d: %s", first, last, msg)
	}
	return last, col, "YAML syntax error: " + msg + hint
}

// yamlMessage splits "yaml: line 3: did not find ..." into 3 and the rest.
func yamlMessage(err error) (line int, msg string) {
	msg = strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, tail, ok := strings.Cut(rest, ": "); ok {
			if l, err := strconv.Atoi(n); err == nil {
				return l, tail
			}
		}
	}
	return 0, msg
}

// lineEnds returns, for each line, the offset just past its end.
func lineEnds(src []byte) []int {
	var ends []int
	for i := 0; i < len(src); {
		if n := lineBreak(src, i); n > 0 {
			i += n
			ends = append(ends, i)
			continue
		}
		i++
	}
	if len(ends) == 0 || ends[len(ends)-1] != len(src) {
		ends = append(ends, len(src))
	}
	return ends
}

// syntaxSearchBytes bounds the bytes findErrorLine re-parses, so a huge
// broken file costs a few parses, not dozens.
const syntaxSearchBytes = 4 << 20

// findErrorLine returns the first line k such that the first k lines fail to
// parse with msg, searching from yaml.v3's guess. Comparing messages keeps a
// cut through a multi-line flow collection or quoted string, which fails
// differently, from being taken for the error. When the search budget runs
// out, first < last bound the line.
func findErrorLine(src []byte, ends []int, msg string, guess int) (first, last int) {
	total := len(ends)
	if total == 0 {
		return 1, 1
	}
	budget := syntaxSearchBytes
	fails := func(k int) bool {
		if k <= 0 {
			return false
		}
		budget -= ends[k-1]
		_, _, err := parseYAML(src[:ends[k-1]])
		if err == nil {
			return false
		}
		_, m := yamlMessage(err)
		return m == msg
	}
	// Invariant: !fails(lo) and fails(hi); the whole document fails.
	lo, hi := min(guess-1, total), total
	if fails(lo) {
		lo = 0
	}
	// The error is usually a few lines past the guess: look there first.
	for step := 1; step <= 8 && lo+step < hi; step *= 2 {
		if fails(lo + step) {
			hi = lo + step
			break
		}
		lo += step
	}
	for hi-lo > 1 && budget > 0 {
		mid := lo + (hi-lo)/2
		if fails(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return lo + 1, hi
}

// lineText returns line n (1-based) of src.
func lineText(src []byte, ends []int, n int) []byte {
	if n < 1 || n > len(ends) {
		return nil
	}
	start := 0
	if n > 1 {
		start = ends[n-2]
	}
	return src[start:ends[n-1]]
}

// culprit points at the likely cause of a syntax error on its line: the
// tab, the unclosed bracket or quote, the unusable character; else the
// line's first non-blank character. hint names the usual fix.
func culprit(text []byte, msg string) (col int, hint string) {
	i := -1
	switch {
	case strings.Contains(msg, "did not find expected ',' or"):
		i, hint = bytes.LastIndexAny(text, "{["), " (an unclosed { or [?)"
	case strings.Contains(msg, "end of stream"):
		i, hint = bytes.LastIndexAny(text, `"'`), " (an unclosed quote?)"
	case bytes.Contains(text, []byte("\t")):
		i, hint = bytes.IndexByte(text, '\t'), " (indent with spaces, not tabs)"
	case strings.Contains(msg, "cannot start any token"):
		i, hint = bytes.IndexAny(text, "@`"), " (quote values that start with @ or `)"
	case strings.Contains(msg, "did not find expected '-' indicator"),
		strings.Contains(msg, "did not find expected key"):
		hint = " (check the indentation)"
	case strings.Contains(msg, "mapping values are not allowed"):
		hint = ` (check the indentation, or quote a value that contains ": ")`
	}
	if strings.Contains(msg, "tab character") {
		hint = ""
	}
	if i < 0 {
		i = bytes.IndexFunc(text, func(r rune) bool { return r != ' ' && r != '\t' })
	}
	if i < 0 {
		return 1, hint
	}
	return utf8.RuneCount(text[:i]) + 1, hint
}

// findAlias finds "*name" outside comment lines, or returns 1, 1.
func findAlias(src []byte, name string) (line, col int) {
	alias := []byte("*" + name)
	ends := lineEnds(src)
	for n := range ends {
		text := lineText(src, ends, n+1)
		if bytes.HasPrefix(bytes.TrimLeft(text, " \t"), []byte("#")) {
			continue
		}
		if i := bytes.Index(text, alias); i >= 0 {
			return n + 1, utf8.RuneCount(text[:i]) + 1
		}
	}
	return 1, 1
}
