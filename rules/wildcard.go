package rules

import "strings"

// A wildcard value has one or more "*", each standing for any run of
// characters, none included, as in envoyproxy/ratelimit: "files/*" matches
// "files/" and "files/a.pdf", "/api*v1" matches "/api/v1" and "/apiv1",
// "svc*ep*rpc" matches "svc-a-ep-b-rpc". Everything but "*" matches itself.

// isWildcard reports whether a descriptor value is a wildcard.
func isWildcard(value string) bool {
	return strings.IndexByte(value, '*') >= 0
}

// wildcardMatch reports whether value matches the wildcard pattern. It does
// not allocate, and takes at most len(pattern)*len(value) steps (the usual
// backtracking to the last "*" only).
func wildcardMatch(pattern, value string) bool {
	if i := strings.IndexByte(pattern, '*'); i == len(pattern)-1 {
		return strings.HasPrefix(value, pattern[:i]) // the common case: a prefix
	}
	p, v := 0, 0
	star, resume := -1, 0 // the last "*" seen, and where value resumes after it
	for v < len(value) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, resume = p, v
			p++
		case p < len(pattern) && pattern[p] == value[v]:
			p++
			v++
		case star >= 0:
			// Let the last "*" take one more character.
			resume++
			p, v = star+1, resume
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// literalLen is how specific a wildcard is: its characters besides "*".
// Of several wildcards that match a value, the most specific wins.
func literalLen(pattern string) int {
	return len(pattern) - strings.Count(pattern, "*")
}
